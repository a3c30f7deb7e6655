"""runtime.cpu_weight: a batch run's processes at a lower CPU weight, their niceness and, in a
session of their own, the session's (autogroup). Each case runs in a child process: the weight
is the process's own and cannot be raised back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cpu_weight import lower

# What the command under the wrapper sees of itself: niceness, whether it leads its session,
# its session's autogroup niceness (from "/autogroup-N nice K"), "-" without autogroups, or "root"
# in the kernel's root group (a process of init's session, as a CI runner's can be: the file is
# empty there).
REPORT = (
    "import os, pathlib; a = pathlib.Path('/proc/self/autogroup'); "
    "print(os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0) == os.getpid(), "
    "((a.read_text().split() or ['root'])[-1] if a.exists() else '-'))"
)
AUTOGROUPS = Path("/proc/self/autogroup").exists()


def _wrapped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.cpu_weight", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_runs_niced_in_a_session_of_its_own_weighted_alike() -> None:
    done = _wrapped("7", sys.executable, "-c", REPORT)
    assert done.returncode == 0, done.stderr
    nice, leads, group_nice = done.stdout.split()
    assert (int(nice), leads) == (7, "True")
    assert group_nice == ("7" if AUTOGROUPS else "-")


def test_niceness_zero_runs_the_command_as_it_is() -> None:
    done = _wrapped("0", sys.executable, "-c", REPORT)
    assert done.returncode == 0, done.stderr
    nice, leads, _ = done.stdout.split()
    assert (int(nice), leads) == (os.getpriority(os.PRIO_PROCESS, 0), "False")


def test_the_command_exit_status_is_the_wrappers() -> None:
    assert _wrapped("5", sys.executable, "-c", "raise SystemExit(3)").returncode == 3


@pytest.mark.parametrize("args", [[], ["7"], ["seven", "true"], ["20", "true"]])
def test_a_bad_call_prints_the_usage(args: list[str]) -> None:
    done = _wrapped(*args)
    assert done.returncode == 2
    assert "usage: python -m runtime.cpu_weight NICE COMMAND" in done.stderr


def test_in_another_programs_session_only_the_process_is_niced() -> None:
    """`ctr batch` under a shell or a supervisor: its niceness, not its session's."""
    code = "from runtime.cpu_weight import lower; print(lower(4))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "['niceness 4']"


def test_a_niceness_outside_0_to_19_is_refused() -> None:
    with pytest.raises(ValueError, match="niceness 20 is not within 0-19"):
        lower(20)
