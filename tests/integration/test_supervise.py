"""infra/supervise.sh, the demo's restart loop: a command that dies is started again, a usage
error is not, SIGTERM reaches the command and ends the loop. Real processes, small commands."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support import ROOT

SUPERVISE = str(ROOT / "infra" / "supervise.sh")


def wait_until(condition, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


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
        wait_until(lambda: child(tmp_path) is not None)
        first = child(tmp_path)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: child(tmp_path) not in (None, first))
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
    script = f"trap 'echo flushed > {done}; exit 0' TERM; while true; do sleep 0.1; done"
    loop = supervise(tmp_path, "bash", "-c", script)
    wait_until(lambda: child(tmp_path) is not None)
    time.sleep(0.3)  # the command's trap is set
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
        wait_until((tmp_path / "restarts.log").exists, 10)
        wait_until(lambda: len((tmp_path / "restarts.log").read_text().splitlines()) >= 3, 15)
        time.sleep(2)
        # 1 s, 2 s, 4 s between starts: no more than 4 restarts in the first ~9 s.
        assert len((tmp_path / "restarts.log").read_text().splitlines()) <= 4
    finally:
        loop.terminate()
        loop.communicate(timeout=20)
    assert loop.returncode == 1
