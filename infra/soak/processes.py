"""The soak's view of this machine's processes, read from ``/proc``: their memory and CPU, the
tree under a pid, and a SIGKILL for a whole tree."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infra.broker import is_alive

PAGE: Final = os.sysconf("SC_PAGE_SIZE")
TICKS: Final = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    ticks: int  # utime + stime
    rss: int  # bytes
    vsize: int = 0  # bytes of address space


def own_memory(members: Iterable[int], procs: dict[int, Proc]) -> int:
    """Resident bytes of ``members``, each address space counted once: a child with its
    parent's address space size is a copy of the parent not yet replaced by an exec (a JVM
    spawning a command shares the JVM's memory until then, and its RSS reads as the whole
    JVM's; a forked copy shares its pages too). Counting those twice put single samples of
    the speed job 600 MB above the rest in two soaks."""
    total = 0
    for pid in members:
        proc = procs.get(pid)
        if proc is None:
            continue
        parent = procs.get(proc.ppid)
        if parent is not None and proc.vsize and proc.vsize == parent.vsize:
            continue
        total += proc.rss
    return total


def processes() -> dict[int, Proc]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        # state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        # (vsize and rss: fields 23 and 24 of proc(5), here 20 and 21)
        found[int(entry.name)] = Proc(
            int(entry.name),
            int(fields[1]),
            int(fields[2]),
            int(fields[11]) + int(fields[12]),
            int(fields[21]) * PAGE,
            int(fields[20]),
        )
    return found


def descendants(pid: int, procs: dict[int, Proc]) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int | None) -> bool:
    return pid is not None and is_alive(pid)


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process under it (a Spark driver's JVM with its Python)."""
    doomed = descendants(pid, processes())
    for member in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    return doomed
