"""The Delta tables the serving layer reads, pinned to one version each per request.

A :class:`LakeSnapshot` names one version of every table (or says a table does not exist yet)
with the Parquet files of that version, so every query of a request reads the same data even
while the speed layer commits a new version every second. :class:`SnapshotSource` keeps one
delta-rs handle per table and refreshes it at most every ``refresh_s`` seconds; with
``max_stale_s``, a request that finds a refresh due gets the current snapshot at once while one
background thread reads the logs, instead of every request of that moment waiting for the read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
from deltalake import DeltaTable

from lake.catalog import SERVED
from lake.settings import LakeSettings
from lake.speed_status import SpeedStatus, read_speed_status, speed_status_path

_log = logging.getLogger(__name__)
SCHEMAS: Final[Mapping[str, pa.Schema]] = {t.name: t.schema for t in SERVED}
ALL_TABLES: Final = tuple(t.name for t in SERVED)
# Reader features whose data a plain Parquet scan of the file list would get wrong.
_UNSUPPORTED_FEATURES: Final = frozenset({"deletionVectors", "columnMapping"})


class UnsupportedTableError(RuntimeError):
    """A table uses a Delta feature the serving layer cannot read (deletion vectors, ...)."""


@dataclass(frozen=True)
class TableSnapshot:
    """One version of one table: its data files, or ``version=None`` if it does not exist."""

    name: str
    path: str
    version: int | None
    files: tuple[str, ...]
    partition_columns: tuple[str, ...]
    schema: pa.Schema = field(compare=False)

    @property
    def exists(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class LakeSnapshot:
    """A consistent view of the lake: one pinned version per table, plus the speed status."""

    tables: Mapping[str, TableSnapshot]
    status: SpeedStatus | None
    status_stamp: int | None = None

    def __getitem__(self, name: str) -> TableSnapshot:
        return self.tables[name]

    @property
    def key(self) -> tuple[object, ...]:
        """Identifies the snapshot's content: equal keys, equal answers."""
        return (*((n, t.version) for n, t in sorted(self.tables.items())), self.status_stamp)

    def versions(self) -> dict[str, int | None]:
        return {name: table.version for name, table in self.tables.items()}


class SnapshotSource:
    """Hands out the latest :class:`LakeSnapshot`, re-reading the Delta logs at most every
    ``refresh_s`` seconds (0: on every call).

    :meth:`cached` never does I/O: when a refresh is due it starts one in the background and,
    while the current snapshot is less than ``refresh_s + max_stale_s`` old, returns that
    (consistent, only older). :meth:`current` always waits for a due refresh.
    """

    def __init__(
        self,
        lake: LakeSettings,
        *,
        tables: tuple[str, ...] = ALL_TABLES,
        refresh_s: float = 0.5,
        max_stale_s: float = 0.0,
    ) -> None:
        if refresh_s < 0:
            raise ValueError(f"'refresh_s' must be >= 0, got {refresh_s}")
        if max_stale_s < 0:
            raise ValueError(f"'max_stale_s' must be >= 0, got {max_stale_s}")
        unknown = set(tables) - set(SCHEMAS)
        if unknown:
            raise ValueError(f"'tables' names unknown tables: {sorted(unknown)}")
        self.lake = lake
        self.tables = tables
        self.refresh_s = refresh_s
        self.max_stale_s = max_stale_s
        self.background_refreshes = 0
        self._handles: dict[str, DeltaTable] = {}
        self._current: LakeSnapshot | None = None
        self._refreshed_at = float("-inf")
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()

    def cached(self) -> LakeSnapshot | None:
        """The latest snapshot without I/O (for an event loop), or None: call :meth:`current`.

        None when there is none yet or it is older than ``refresh_s + max_stale_s``; a snapshot
        past ``refresh_s`` is returned while a background refresh replaces it."""
        current = self._current
        if current is None:
            return None
        age = time.monotonic() - self._refreshed_at
        if age < self.refresh_s:
            return current
        if age >= self.refresh_s + self.max_stale_s:
            return None
        if self._refreshing.acquire(blocking=False):
            threading.Thread(
                target=self._refresh_in_background, name="snapshot-refresh", daemon=True
            ).start()
        return current

    def _refresh_in_background(self) -> None:
        try:
            self.background_refreshes += 1
            self.current()
        except Exception as exc:  # current() raises it to requests once the snapshot is too old
            _log.warning("refreshing the lake snapshot failed (will retry): %s", exc)
        finally:
            self._refreshing.release()

    def current(self) -> LakeSnapshot:
        now = time.monotonic()
        current = self._current
        if current is not None and now - self._refreshed_at < self.refresh_s:
            return current
        with self._lock:
            if self._current is not None and time.monotonic() - self._refreshed_at < self.refresh_s:
                return self._current
            self._current = self._refresh(self._current)
            self._refreshed_at = time.monotonic()
            return self._current

    def _refresh(self, previous: LakeSnapshot | None) -> LakeSnapshot:
        tables = {}
        for name in self.tables:
            old = previous.tables.get(name) if previous is not None else None
            tables[name] = self._table(name, old)
        status_path = speed_status_path(self.lake)
        try:
            stamp: int | None = status_path.stat().st_mtime_ns
        except OSError:
            stamp = None
        if previous is not None and stamp == previous.status_stamp:
            status = previous.status
        else:
            status = read_speed_status(status_path) if stamp is not None else None
        return LakeSnapshot(tables=tables, status=status, status_stamp=stamp)

    def _table(self, name: str, old: TableSnapshot | None) -> TableSnapshot:
        path = self.lake.table(name)
        handle = self._handles.get(name)
        if handle is None:
            if not DeltaTable.is_deltatable(path):
                return TableSnapshot(name, path, None, (), (), SCHEMAS[name])
            handle = self._handles[name] = DeltaTable(path)
        else:
            handle.update_incremental()
        version = handle.version()
        if old is not None and old.version == version:
            return old
        features = set(handle.protocol().reader_features or ())
        if features & _UNSUPPORTED_FEATURES:
            raise UnsupportedTableError(
                f"{name} (version {version}) uses Delta reader feature(s) "
                f"{sorted(features & _UNSUPPORTED_FEATURES)}, which the serving layer cannot read"
            )
        return TableSnapshot(
            name=name,
            path=path,
            version=version,
            files=tuple(handle.file_uris()),
            partition_columns=tuple(handle.metadata().partition_columns),
            schema=pa.schema(handle.schema().to_arrow()),
        )
