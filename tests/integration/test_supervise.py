"""infra/supervise.sh, the demo's restart loop: a command that dies is started again, a usage
error is not, SIGTERM reaches the command and ends the loop. Real processes, small commands."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from pathlib import Path

from tests.support import ROOT
from tests.support.waiting import wait_until

SUPERVISE = str(ROOT / "infra" / "supervise.sh")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def supervise(tmp_path: Path, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", SUPERVISE, "job", *command],
        env={**os.environ, "SUPERVISE_DIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def child(tmp_path: Path) -> int | None:
    try:
        return int((tmp_path / "job.child.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def test_a_killed_command_is_started_again_and_the_restart_is_recorded(tmp_path: Path) -> None:
    loop = supervise(tmp_path, "sleep", "300")
    try:
        wait_until(lambda: child(tmp_path) is not None, timeout_s=60, what="the command started")
        first = child(tmp_path)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(
            lambda: child(tmp_path) not in (None, first), timeout_s=60, what="it started again"
        )
        second = child(tmp_path)
        assert second is not None
        assert alive(second)
        [line] = (tmp_path / "restarts.log").read_text().splitlines()
        _, name, status, _ = line.split()
        assert (name, status) == ("job", str(128 + signal.SIGKILL))
    finally:
        loop.terminate()
        out, _ = loop.communicate(timeout=20)
    assert "exited with status 137" in out
    assert loop.returncode == 128 + signal.SIGTERM  # sleep's own status: it got the SIGTERM
    assert not alive(second)
    assert not (tmp_path / "job.child.pid").exists()


def test_sigterm_reaches_the_command_which_finishes_its_work(tmp_path: Path) -> None:
    done = tmp_path / "flushed"
    trapped = tmp_path / "trapped"
    script = (
        f"trap 'echo flushed > {done}; exit 0' TERM; touch {trapped}; "
        "while true; do sleep 0.1; done"
    )
    loop = supervise(tmp_path, "bash", "-c", script)
    wait_until(trapped.exists, timeout_s=60, what="the command set its trap")
    loop.send_signal(signal.SIGTERM)
    loop.communicate(timeout=20)
    assert done.read_text() == "flushed\n"
    assert loop.returncode == 0
    assert not (tmp_path / "restarts.log").exists()


def test_a_usage_error_is_not_restarted(tmp_path: Path) -> None:
    loop = supervise(tmp_path, "bash", "-c", "echo bad flag >&2; exit 2")
    out, _ = loop.communicate(timeout=20)
    assert loop.returncode == 2
    assert "usage error" in out
    assert not (tmp_path / "restarts.log").exists()


def test_a_crash_loop_backs_off(tmp_path: Path) -> None:
    loop = supervise(tmp_path, "bash", "-c", "exit 1")
    try:
        log = tmp_path / "restarts.log"
        wait_until(log.exists, timeout_s=60, what="the first restart")
        wait_until(
            lambda: len(log.read_text().splitlines()) >= 4, timeout_s=60, what="four restarts"
        )
        # 1 s, 2 s, 4 s between starts: no more than 4 restarts in the first ~9 s, each at
        # least its back-off after the one before (epoch seconds, the log's first column).
        restarts = log.read_text().splitlines()
        assert len(restarts) <= 4
        epochs = [int(line.split()[0]) for line in restarts]
        gaps = [later - earlier for earlier, later in itertools.pairwise(epochs)]
        assert [gap >= least for gap, least in zip(gaps, (1, 2, 4), strict=True)] == [True] * 3, (
            gaps
        )
    finally:
        loop.terminate()
        loop.communicate(timeout=20)
    assert loop.returncode == 1
