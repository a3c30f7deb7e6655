"""The lake as it was at an earlier moment (as-of queries): :class:`PastSnapshots`.

Each table at its last version committed at or before the moment, found with a few file stats
of its log (:mod:`serving_layer.delta_log`); the versions read are kept for the next requests of
that moment (a version never changes; reading one replays its log: tens of ms).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict
from typing import Final

import pyarrow.fs as pafs
from deltalake.exceptions import DeltaError

from lake.settings import LakeSettings
from lake.storage import arrow_filesystem, open_delta, store_path
from runtime.object_store import ObjectStoreSettings
from runtime.times import EPOCH
from serving_layer.delta_log import DeltaLog, commit_ns, first_true, log_of, log_span, version_at
from serving_layer.lake_snapshot import (
    SCHEMAS,
    AsOfError,
    LakeSnapshot,
    TableSnapshot,
    table_snapshot,
)

# Table versions read for as-of snapshots, kept for the next requests of that moment.
_PAST_VERSIONS: Final = 32


class PastSnapshots:
    """Snapshots of ``lake``'s ``tables`` as of earlier moments; thread-safe."""

    def __init__(self, lake: LakeSettings, tables: tuple[str, ...]) -> None:
        self.lake = lake
        self.tables = tables
        self._past: OrderedDict[tuple[str, int], TableSnapshot] = OrderedDict()
        self._past_lock = threading.Lock()

    def at(self, moment: dt.datetime, current: LakeSnapshot | None = None) -> LakeSnapshot:
        """The lake as of ``moment``: every table at its last version committed at or before it
        (``version=None``: first committed later), without the speed status (not versioned).

        Never kept as the current snapshot (the table versions read are kept for the next
        requests of the moment). Commit times are those of :mod:`serving_layer.delta_log`.
        Raises :class:`AsOfError`. ``current``: the latest snapshot, whose tables serve the
        moments they were current at.
        """
        if moment.tzinfo is None:
            raise ValueError(f"'moment' must be timezone-aware, got {moment.isoformat()}")
        if moment > dt.datetime.now(dt.UTC):
            raise AsOfError(f"{_iso(moment)} is in the future")
        moment_ns = (moment - EPOCH) // dt.timedelta(microseconds=1) * 1000
        tables = {}
        first_commits = []
        for name in self.tables:
            path = self.lake.table(name)
            log = log_of(path, self.lake.object_store)
            hint = current.tables[name].version if current is not None else None
            span = log_span(log, hint)
            if span is None:
                tables[name] = TableSnapshot(name, path, None, (), (), SCHEMAS[name])
                continue
            first, last = span
            if first == 0 and (created := commit_ns(log, 0)) is not None:
                first_commits.append(created)
            version = version_at(log, moment_ns, first, last)
            if version is None and first == 0:
                tables[name] = TableSnapshot(name, path, None, (), (), SCHEMAS[name])
            elif version is None:
                raise AsOfError(
                    f"{name} cannot be read as of {_iso(moment)}: its log was cleaned up "
                    f"(retention){_readable_from(self.lake, name, log, first, last)}"
                )
            elif current is not None and current.tables[name].version == version:
                tables[name] = current.tables[name]
            else:
                tables[name] = self._table_at(name, log, version, last, moment)
        if not any(table.exists for table in tables.values()):
            since = f" ({_commit_iso(min(first_commits))})" if first_commits else ", none yet"
            raise AsOfError(f"{_iso(moment)} is before the lake's first commit{since}")
        return LakeSnapshot(tables=tables, status=None, store=self.lake.object_store)

    def _table_at(
        self, name: str, log: DeltaLog, version: int, last: int, moment: dt.datetime
    ) -> TableSnapshot:
        path = self.lake.table(name)
        with self._past_lock:
            table = self._past.get((name, version))
            if table is not None:
                self._past.move_to_end((name, version))
        try:
            if table is None:
                handle = open_delta(path, self.lake.object_store, version=version)
                table = table_snapshot(name, path, handle)
        except DeltaError:
            removed = "its log was cleaned up"
        else:
            if _files_exist(table, self.lake.object_store):
                with self._past_lock:
                    self._past[(name, version)] = table
                    while len(self._past) > _PAST_VERSIONS:
                        self._past.popitem(last=False)
                return table
            removed = "its data files were vacuumed"
        raise AsOfError(
            f"{name} version {version}, its version at {_iso(moment)}, cannot be read: {removed} "
            f"(retention){_readable_from(self.lake, name, log, version + 1, last)}"
        )


def _readable_from(lake: LakeSettings, name: str, log: DeltaLog, low: int, high: int) -> str:
    """``; <name> can be read as of <time> or later``: the commit time of the first version
    of ``low..high`` whose log and files are there ("" if none is)."""
    path = lake.table(name)

    def readable(version: int) -> bool:
        try:
            handle = open_delta(path, lake.object_store, version=version)
            return _files_exist(table_snapshot(name, path, handle), lake.object_store)
        except DeltaError:
            return False

    # Retention removes versions from the oldest on: the readable ones are the newest.
    if high < low or not readable(high):
        return ""
    committed = commit_ns(log, first_true(readable, low, high))
    return f"; {name} can be read as of {_commit_iso(committed)} or later" if committed else ""


def _files_exist(table: TableSnapshot, store: ObjectStoreSettings) -> bool:
    if not table.files:
        return True
    filesystem, _ = arrow_filesystem(table.path, store)
    paths = [store_path(f) for f in table.files]
    return all(info.type != pafs.FileType.NotFound for info in filesystem.get_file_info(paths))


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _commit_iso(ns: int) -> str:
    # Rounded up to the microsecond: as of the time printed, the commit is there.
    return _iso(EPOCH + dt.timedelta(microseconds=-(-ns // 1000)))
