"""When the versions of a Delta table were committed: the version current at a given moment.

A commit's time is the modification time of its log file (``_delta_log/<version>.json``), as the
Delta protocol defines it for tables without in-commit timestamps (delta-rs' and Spark's time
travel read it too). Versions are found with a few file stats, binary searches over version
numbers, rather than a listing of the log: it holds a file per commit, and the speed layer
commits every second. The log is read through pyarrow's filesystem (a local folder, or an object
store's ``LastModified``: :func:`log_of`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow.fs as pafs

from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings

_COMMIT_FILE: Final = re.compile(r"(\d{20})\.json")


@dataclass(frozen=True)
class DeltaLog:
    """A table's ``_delta_log`` folder on its filesystem."""

    filesystem: pafs.FileSystem
    path: str


def log_of(table: str | Path, store: ObjectStoreSettings) -> DeltaLog:
    """The log of the Delta table at ``table`` (a path, or an object-store URI on ``store``)."""
    filesystem, base = arrow_filesystem(str(table), store)
    return DeltaLog(filesystem, f"{base}/_delta_log")


def commit_ns(log: DeltaLog, version: int) -> int | None:
    """When ``version`` was committed (ns since the epoch), or None if its log file is gone."""
    info = log.filesystem.get_file_info(f"{log.path}/{version:020d}.json")
    if info.type == pafs.FileType.NotFound or info.mtime_ns is None:
        return None
    return int(info.mtime_ns)


def log_span(log: DeltaLog, hint: int | None = None) -> tuple[int, int] | None:
    """The first and the last version that have a log file; None if none has (no table).

    ``hint``: a version known to have been committed (the current snapshot's), the start of the
    search for the last one; otherwise version 0, or a listing of the log when 0 was cleaned up.
    """

    def exists(version: int) -> bool:
        return commit_ns(log, version) is not None

    if hint is not None and exists(hint):
        start = hint
    elif exists(0):
        start = 0
    else:
        versions = _listed(log)
        if not versions:
            return None
        start = versions[0]
    # Log files exist for one run of versions: old ones are cleaned up, new ones appended.
    first = first_true(exists, 0, start)
    step = 1
    last = start
    while exists(last + step):
        last += step
        step *= 2
    return first, last_true(exists, last, last + step - 1)


def version_at(log: DeltaLog, moment_ns: int, first: int, last: int) -> int | None:
    """The last version in ``first..last`` committed at or before ``moment_ns``; None if
    ``first`` was committed after it. A log file removed meanwhile counts as committed before."""

    def committed(version: int) -> bool:
        at = commit_ns(log, version)
        return at is None or at <= moment_ns

    if not committed(first):
        return None
    return last_true(committed, first, last)


def first_true(predicate: Callable[[int], bool], low: int, high: int) -> int:
    """The first of ``low..high`` for which ``predicate`` holds, given it holds for ``high`` and
    for every version after the first it holds for."""
    below, found = low - 1, high
    while found - below > 1:
        middle = (below + found) // 2
        if predicate(middle):
            found = middle
        else:
            below = middle
    return found


def last_true(predicate: Callable[[int], bool], low: int, high: int) -> int:
    """The last of ``low..high`` for which ``predicate`` holds, given it holds for ``low`` and
    for every version before the last it holds for."""
    found, above = low, high + 1
    while above - found > 1:
        middle = (found + above) // 2
        if predicate(middle):
            found = middle
        else:
            above = middle
    return found


def _listed(log: DeltaLog) -> list[int]:
    infos = log.filesystem.get_file_info(pafs.FileSelector(log.path, allow_not_found=True))
    names = (info.base_name for info in infos)
    return sorted(int(m.group(1)) for name in names if (m := _COMMIT_FILE.fullmatch(name)))
