"""The JVMs of the local cluster as processes: pid files, liveness, stopping and reaping,
the Java they need, and what their logs say went wrong."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Final

from infra.broker.errors import BrokerError

MIN_JAVA: Final = 17
# The JVMs this process started, so that they are waited for (and no Popen is dropped while
# its process runs).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def track(process: subprocess.Popen[bytes]) -> None:
    """Keep ``process`` (a JVM this process started) until it has exited and been reaped."""
    _CHILDREN[process.pid] = process


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while is_alive(pid) and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.1)
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap(pid)


def reap(pid: int | None) -> None:
    if pid is None:
        return
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _CHILDREN[pid]
        return
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(pid, os.WNOHANG)


def first_error(log: str) -> str:
    """The first line of a JVM log that says what went wrong."""
    for line in log.splitlines():
        if re.search(r"\b(ERROR|FATAL)\b|Exception|Error:", line):
            return line.strip()[:400]
    lines = [line for line in log.splitlines() if line.strip()]
    return lines[-1].strip()[:400] if lines else "(no output)"


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def check_java(java: str) -> str:
    """``java`` if it runs and is at least Java 17; :class:`BrokerError` naming the fix."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        raise BrokerError(
            f"Java is not installed ({java!r} not found): Apache Kafka needs Java {MIN_JAVA}+; "
            "Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
        ) from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))  # "1.8" is Java 8
    if major < MIN_JAVA:
        raise BrokerError(
            f"Apache Kafka needs Java {MIN_JAVA} or newer; {java} is "
            f"{major or 'of unknown version'}: install openjdk-17-jre-headless and put it first "
            "on PATH, or set JAVA_HOME"
        )
    return java
