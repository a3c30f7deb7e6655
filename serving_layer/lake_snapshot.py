"""One version of every served Delta table: :class:`LakeSnapshot`, what a request reads.

A snapshot names one version of every table (or says a table does not exist yet) with the
Parquet files of that version, so every query of a request reads the same data even while the
speed layer commits a new version every second. :mod:`serving_layer.snapshots` keeps the
current one; :mod:`serving_layer.past_snapshots` gives those of earlier moments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

from lake.catalog import SERVED, Table
from lake.speed_status import SpeedStatus
from runtime.object_store import ObjectStoreSettings
from serving_layer.delta_log import commit_ns, log_of
from serving_layer.errors import ServingError

SCHEMAS: Final[Mapping[str, pa.Schema]] = {t.name: t.schema for t in SERVED}
ALL_TABLES: Final = tuple(t.name for t in SERVED)
# Reader features whose data a plain Parquet scan of the file list would get wrong.
_UNSUPPORTED_FEATURES: Final = frozenset({"deletionVectors", "columnMapping"})


class BehindError(ServingError, RuntimeError):
    """The lake's tables are not (yet) at versions a client has already seen: another
    replica read newer ones than this one can find (a 503: ask again)."""


class UnsupportedTableError(ServingError, RuntimeError):
    """A table uses a Delta feature the serving layer cannot read (deletion vectors, ...)."""


class AsOfError(ServingError, ValueError):
    """The lake cannot be read as of the moment asked: it is before the lake's first commit or
    in the future, or a table's version of then was removed (log cleanup or vacuum)."""


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
    # Where the tables' files are (a local lake: never asked): the SQL sandbox's workers read
    # them with it.
    store: ObjectStoreSettings
    status_stamp: tuple[int, int] | None = None

    def __getitem__(self, table: str | Table) -> TableSnapshot:
        """A table's snapshot, by the catalog's :class:`~lake.catalog.Table` or its name."""
        return self.tables[table if isinstance(table, str) else table.name]

    @property
    def key(self) -> tuple[object, ...]:
        """Identifies the snapshot's content: equal keys, equal answers."""
        return (*((n, t.version) for n, t in sorted(self.tables.items())), self.status_stamp)

    def versions(self) -> dict[str, int | None]:
        return {name: table.version for name, table in self.tables.items()}

    def behind(self, wanted: Mapping[str, int]) -> list[str]:
        """The tables of ``wanted`` (name to version) this snapshot holds at older versions
        (or not at all); tables it does not serve are not its to answer for."""
        return sorted(
            name
            for name, version in wanted.items()
            if name in self.tables and _version(self.tables[name].version) < version
        )


def key_covers(key: object, wanted: Mapping[str, int]) -> bool:
    """Whether the snapshot of :attr:`LakeSnapshot.key` ``key`` holds every table of
    ``wanted`` at its version or a newer one (an answer computed on it is not older)."""
    if not wanted:
        return True
    if not isinstance(key, tuple):
        return False
    versions = {p[0]: p[1] for p in key if isinstance(p, tuple) and len(p) == 2}
    return all(
        _version(versions[name]) >= version for name, version in wanted.items() if name in versions
    )


def _version(version: object) -> int:
    return version if isinstance(version, int) else -1


def table_snapshot(name: str, path: str, handle: DeltaTable) -> TableSnapshot:
    """The snapshot of ``handle``'s version; :class:`UnsupportedTableError` for a table whose
    files a plain scan would read wrong."""
    version = handle.version()
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
        # Sorted: every process lists a version's files in one order (incremental or not).
        files=tuple(sorted(handle.file_uris())),
        partition_columns=tuple(handle.metadata().partition_columns),
        schema=pa.schema(handle.schema().to_arrow()),
    )


def log_exists(path: str, store: ObjectStoreSettings) -> bool:
    """Whether the table at ``path`` has a log yet: its first commit, or a checkpoint once
    that was cleaned up. Two stats through pyarrow, which releases the GIL while it waits (an
    object store's round trips overlap across tables); delta-rs' is_deltatable holds it."""
    log = log_of(path, store)
    if commit_ns(log, 0) is not None:
        return True
    info = log.filesystem.get_file_info(f"{log.path}/_last_checkpoint")
    return bool(info.type != pafs.FileType.NotFound)
