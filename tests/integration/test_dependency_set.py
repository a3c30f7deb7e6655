"""The pinned dependency set installs on the Python a fresh machine has: Debian 12's own 3.11.2,
not only the newer 3.11 of the machine that locked it (a package asking for 3.11.5 once broke a
fresh machine's `make setup` while every run here was green)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")


def test_the_pinned_set_resolves_for_debian_12s_python() -> None:
    wheels = Path(os.environ.get("CTR_WHEEL_CACHE", Path.home() / ".cache/ctr-lambda/wheels"))
    done = subprocess.run(
        [UV, "pip", "compile", "--quiet", "--python-version", "3.11.2", "--find-links", wheels,
         "-c", ROOT / "constraints.txt", "-", "-o", os.devnull],
        input="-e .[dev]\n", cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "UV_SYSTEM_CERTS": "1"}, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
