"""A packed environment's manifest alone, in an archive of the real format: what a driver
checks before it ships one (runtime.python_archive), without building the environment."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from infra.python_archive import project_packages
from runtime.python_archive import MANIFEST_NAME, Manifest, code_digest, package_files
from tests.support import ROOT


def manifest_of_this_checkout() -> Manifest:
    packages = project_packages(ROOT)
    return Manifest(
        packages=tuple(packages),
        code_digest=code_digest(package_files(packages)),
        python="3.11",
        interpreter="/usr/bin/python3.11",
        dependencies="0123456789ab",
    )


def manifest_archive(path: Path, manifest: Manifest) -> Path:
    """``path``, a .tar.gz holding ``manifest`` first (and nothing else)."""
    data = manifest.to_json()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path
