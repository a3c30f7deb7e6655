"""The batch layer's lower CPU weight (``SPARK_BATCH_NICE``): on a host a batch run shares with
the API, the API's answers come first and the batch run takes what is left.

Two things decide a process's share of a busy Linux CPU: its niceness, among the processes it
competes with, and, where the kernel groups processes by session (autogroup, sched(7): on by
default in most distributions, and here), the session's own niceness: between sessions, CPU is
shared by session whatever the processes' niceness inside them. So a batch run's processes get
both: their niceness, inherited by everything the process starts from then on (the Spark JVM,
its Python workers), and, in a session of their own, that session's niceness.

Under systemd or another cgroup manager each service has its own cgroup, and the cgroups'
``cpu.weight`` (systemd's ``CPUWeight=``) shares CPU between them instead: there, give the
Airflow workers' unit a lower weight than the API's (docs/guides/deploy.md).

``python -m runtime.cpu_weight NICE COMMAND [ARG ...]`` runs a command in a session of its own at
that weight: the Airflow tasks' spark-submit (dags.definitions) starts so.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path
from typing import Final

AUTOGROUP: Final = Path("/proc/self/autogroup")
USAGE: Final = "usage: python -m runtime.cpu_weight NICE COMMAND [ARG ...]"


def lower(nice: int, *, own_session: bool = False) -> list[str]:
    """Run this process, and every process it starts from here on, at niceness ``nice`` (0-19;
    a niceness already higher is kept: a weight is only ever lowered). ``own_session``: first
    start a session of its own (a process that leads no process group: one started by another
    program, not a shell's job), so the session's niceness is this process tree's alone; else
    that niceness is set only if this process already leads its session. What was done, for the
    log."""
    if not 0 <= nice <= 19:
        raise ValueError(f"niceness {nice} is not within 0-19")
    done: list[str] = []
    if nice == 0:
        return done
    if own_session and os.getsid(0) != os.getpid():
        os.setsid()
        done.append("own session")
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current < nice:
        # Linux keeps the niceness per thread: this one's, which threads and processes started
        # from it inherit (call it before starting the JVM, from the thread that starts it).
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        done.append(f"niceness {nice}")
    if os.getsid(0) == os.getpid() and AUTOGROUP.exists():
        done.append(_set_session_nice(nice))
    return done


def _set_session_nice(nice: int, attempts: int = 3) -> str:
    """Write the session's autogroup niceness. Without CAP_SYS_ADMIN the kernel takes one such
    write a tenth of a second, machine-wide (EAGAIN otherwise): tried again after that."""
    for attempt in range(attempts):
        try:
            AUTOGROUP.write_text(str(nice))
            return f"session's niceness {nice}"
        except OSError as exc:  # RLIMIT_NICE, or a kernel that refuses it: the niceness holds
            if exc.errno != errno.EAGAIN or attempt == attempts - 1:
                return f"session's niceness not set ({exc.strerror})"
            time.sleep(0.11)
    return "session's niceness not set (not tried)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or not args[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    try:
        lower(int(args[0]), own_session=True)
    except ValueError as exc:
        print(f"runtime.cpu_weight: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    os.execvp(args[1], args[1:])
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main())
