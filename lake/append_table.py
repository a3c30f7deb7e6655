"""A Delta table its one writer process appends to from the driver, exactly once per
(application id, version), with delta-rs.

Why delta-rs and not delta-spark for these appends (the archiver's ``master/*`` tables, the
speed layer's ``speed/*``): their rows are already on the driver, and a delta-spark append that
carries an application transaction costs a Spark job, the commit and a reconstruction of the
table's state to look the transaction up (about 1.5 s per table on a 2-core machine, measured
by ``python -m bench archive``); delta-rs commits the same rows in tens of milliseconds, and
reads the transaction from a handle it keeps up to date incrementally.

A commit carries the application transaction (``app_id``, ``version``); a version the table
already holds (Spark replays the last micro-batch after a crash) writes nothing, so a replay
is a no-op table by table.

The writer also keeps its tables small (:meth:`AppendTable.maintain`): a micro-batch every few
seconds leaves a small file each, so it bin-packs them (delta-rs OPTIMIZE, an
append-compatible rewrite) and deletes the files no version within the table's
``delta.deletedFileRetentionDuration`` needs (VACUUM). Each pass is bounded by what arrived
since the last one, not by the table: it compacts only the partitions holding more than one
small file (at most :data:`PARTITIONS_PER_PASS`, the most recently written first), and its
VACUUM is *lite* (the removals the log's checkpoint still holds as tombstones). A *full* VACUUM
lists the whole directory, which grows with the table; it alone finds the files a crashed
attempt wrote and never committed, so the writer asks for one rarely (the archiver: at its
first pass after a start, then daily).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from lake.data_files import DataFile, partition_string
from lake.storage import delta_options, ensure_properties, is_delta, open_delta
from runtime.connectors import is_commit_conflict
from runtime.object_store import ObjectStoreSettings

log = logging.getLogger("ctr.lake")

# Files an OPTIMIZE packs small ones into (delta-rs's default is 100 MiB).
COMPACT_TARGET_BYTES: Final = 128 * 1024 * 1024
# Partitions one maintenance pass compacts at most (a bounded slice; the next pass goes on).
PARTITIONS_PER_PASS: Final = 8
# Tries of an append refused for a concurrent commit's removals (AppendTable.append).
APPEND_ATTEMPTS: Final = 5


@dataclass(frozen=True)
class Maintained:
    """What :meth:`AppendTable.maintain` did to a table."""

    path: str
    files_removed: int  # small files packed ...
    files_added: int  # ... into these
    files_vacuumed: int
    full_vacuum: bool = True
    partitions_left: int = 0  # partitions with small files left for the next pass

    def __str__(self) -> str:
        left = f", {self.partitions_left} partition(s) left" if self.partitions_left else ""
        return (
            f"{self.path}: {self.files_removed} files compacted into {self.files_added}{left}, "
            f"{self.files_vacuumed} vacuumed ({'full' if self.full_vacuum else 'lite'})"
        )


class AppendTable:
    """The Delta table at ``path`` (on the lake's object store ``store`` when it is there; rows
    of ``schema``), held open between commits by its one writer; ``properties`` are set when the
    table is created and kept on an existing one."""

    def __init__(
        self,
        path: str,
        store: ObjectStoreSettings,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.store = store
        self.schema = schema
        self.partition_by = list(partition_by)
        self.properties = dict(properties or {})
        self._table: DeltaTable | None = None

    @property
    def table(self) -> DeltaTable | None:
        """The table, refreshed to its latest version; None while it does not exist."""
        if self._table is None:
            if not is_delta(self.path, self.store):
                return None
            self._table = open_delta(self.path, self.store)
            self._ensure_properties(self._table)
        else:
            self._table.update_incremental()
        return self._table

    def _ensure_properties(self, table: DeltaTable) -> None:
        """On opening the table: its properties (a subclass may check more)."""
        ensure_properties(table, self.properties)

    def maintain(
        self,
        *,
        target_size: int = COMPACT_TARGET_BYTES,
        full_vacuum: bool = True,
        partitions_per_pass: int = PARTITIONS_PER_PASS,
    ) -> Maintained:
        """Bin-pack the small files of at most ``partitions_per_pass`` partitions into files of
        about ``target_size`` bytes (each partition apart), then VACUUM past the table's file
        retention: ``full_vacuum`` lists the directory (see the module's docstring), else lite.
        Uses a handle of its own: it may run in another thread than the commits."""
        if not is_delta(self.path, self.store):
            return Maintained(self.path, 0, 0, 0, full_vacuum)
        table = open_delta(self.path, self.store)
        chosen = _small_partitions(table, self.partition_by, target_size)
        removed = added = 0
        for partition in chosen[:partitions_per_pass]:
            filters = [(name, "=", value) for name, value in partition.items()]
            metrics = table.optimize.compact(
                partition_filters=filters or None,
                target_size=target_size,
            )
            removed += int(metrics.get("numFilesRemoved", 0))
            added += int(metrics.get("numFilesAdded", 0))
        vacuumed = table.vacuum(retention_hours=None, dry_run=False, full=full_vacuum)
        left = max(0, len(chosen) - partitions_per_pass)
        return Maintained(self.path, removed, added, len(vacuumed), full_vacuum, left)

    def vacuum(self, *, full: bool = True) -> int:
        """Delete the files no version within the table's ``delta.deletedFileRetentionDuration``
        needs (``full``: also files no commit ever named: see the module's docstring);
        returns how many."""
        table = self.table
        if table is None:
            return 0
        return len(table.vacuum(retention_hours=None, dry_run=False, full=full))

    def version(self) -> int | None:
        """The table's latest version (None while it does not exist)."""
        table = self.table
        return table.version() if table is not None else None

    def committed(self, app_id: str, version: int) -> bool:
        """Whether the table already holds the commit of (``app_id``, ``version``)."""
        return _holds(self.table, app_id, version)

    def append(self, rows: pa.Table, *, app_id: str, version: int) -> bool:
        """Append ``rows`` in one commit carrying (``app_id``, ``version``); nothing if the
        table holds that commit already. Returns whether it wrote.

        delta-rs refuses an append when another writer's commit removed files after the
        append read the table ("a concurrent transaction deleted data this operation read":
        the batch job's clean-up of master/arrivals, a compaction), the wider the window the
        busier the machine. The append is then tried again on the newer version, up to
        :data:`APPEND_ATTEMPTS` times: it adds rows only, and the transaction makes a retry
        of a commit that did land a no-op."""
        data = rows.select(self.schema.names).cast(self.schema)

        def write(table: DeltaTable | None) -> None:
            write_deltalake(
                table if table is not None else self.path,
                data,
                mode="append",
                partition_by=self.partition_by or None,
                configuration=(self.properties or None) if table is None else None,
                storage_options=delta_options(self.path, self.store) if table is None else None,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id=app_id, version=version)]
                ),
            )

        return self._once(app_id, version, write)

    def _once(self, app_id: str, version: int, write: Callable[[DeltaTable | None], None]) -> bool:
        """``write`` (given the table, None while it does not exist) as the commit of
        (``app_id``, ``version``), unless the table holds it already; a commit refused for a
        concurrent one is tried again on the newer version, up to :data:`APPEND_ATTEMPTS`
        times. Returns whether it wrote."""
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            table = self.table
            if self._replayed(table, app_id, version):
                return False
            try:
                write(table)
                return True
            except Exception as exc:
                if not is_commit_conflict(exc) or attempt == APPEND_ATTEMPTS:
                    raise
                log.info("%s: commit conflicted (attempt %d), retried: %s", self.path, attempt, exc)
        raise AssertionError("unreachable")

    def _replayed(self, table: DeltaTable | None, app_id: str, version: int) -> bool:
        if not _holds(table, app_id, version):
            return False
        log.info("%s: batch %d already committed (a replay): skipped", self.path, version)
        return True

    def commit(
        self,
        files: Sequence[DataFile],
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, str] | None = None,
    ) -> bool:
        """Commit Parquet files already written under the table's root
        (:func:`lake.data_files.write_files`, in Spark tasks) as one append carrying
        (``app_id``, ``version``) and ``metadata`` (the commit's custom metadata); nothing if
        the table holds that commit already (the files then stay unnamed, for VACUUM).
        Returns whether it committed.

        The writer's maintenance commits from another thread (its own handle); a commit the
        conflict check refuses for one of those is tried again on the newer version, as
        :meth:`append` does."""
        actions: list[AddAction | RemoveAction] = [add_action(f) for f in files]

        def write(table: DeltaTable | None) -> None:
            if table is None:
                table = self._table = DeltaTable.create(
                    self.path,
                    self.schema,
                    partition_by=self.partition_by or None,
                    configuration=self.properties or None,
                    storage_options=delta_options(self.path, self.store),
                )
            table.create_write_transaction(
                actions,
                mode="append",
                schema=self.schema,
                partition_by=self.partition_by or None,
                commit_properties=CommitProperties(
                    custom_metadata=dict(metadata) if metadata else None,
                    app_transactions=[Transaction(app_id=app_id, version=version)],
                ),
            )

        return self._once(app_id, version, write)


def add_action(file: DataFile, *, data_change: bool = True) -> AddAction:
    """The log's add action of a file :func:`lake.data_files.write_files` wrote
    (``data_change=False``: a compaction's, the same rows rewritten)."""
    return AddAction(
        path=file["path"],
        size=file["size"],
        partition_values=json.loads(file["partition_values"]),
        modification_time=file["modification_time"],
        data_change=data_change,
        stats=file["stats"],
    )


def _small_partitions(
    table: DeltaTable, partition_by: Sequence[str], target_size: int
) -> list[dict[str, str | None]]:
    """The partitions (their values; one empty one for an unpartitioned table) holding more
    than one file under ``target_size`` bytes, the most recently written first, from the log's
    file list (metadata only)."""
    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return []
    small = files.filter(pc.less(files.column("size_bytes"), target_size))
    keys = [f"partition.{name}" for name in partition_by]
    if not keys:
        return [{}] if small.num_rows > 1 else []
    grouped = small.group_by(keys).aggregate([("path", "count"), ("modification_time", "max")])
    grouped = grouped.filter(pc.greater(grouped.column("path_count"), 1))
    grouped = grouped.sort_by([("modification_time_max", "descending")])
    return [
        {name: partition_string(row[key]) for name, key in zip(partition_by, keys, strict=True)}
        for row in grouped.select(keys).to_pylist()
    ]


def _holds(table: DeltaTable | None, app_id: str, version: int) -> bool:
    """Whether ``table`` holds a commit of ``app_id`` at ``version`` or later."""
    done = table.transaction_version(app_id) if table is not None else None
    return done is not None and done >= version
