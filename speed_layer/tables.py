"""The speed layer's tables, ``speed/ctr`` (partial counts) and ``speed/late`` (what it dropped),
committed by the speed job's driver with delta-rs; their files are written by Spark tasks.

Why delta-rs for the commits: the driver holds only the files' descriptions, and delta-rs commits
them in tens of milliseconds where a delta-spark commit costs a Spark job and a snapshot update
(:mod:`lake.append_table`, which the archiver's tables share). The speed job is the only writer
of both tables, in one process.

- **Append, exactly once.** Each micro-batch *appends* its tasks' files of counts per (bucket,
  dimensions) in one commit carrying the application transaction (speed query id, batch id); a
  batch whose transaction the table already holds (Spark replays the last batch after a crash)
  writes nothing. Readers sum the rows per key (the serving layer does).
- **Roll-up.** Once the watermark closes a bucket, no on-time row can reach it any more: every
  minute the job replaces the files whose buckets are all closed since its last roll-up by one
  file of their rows summed per key, in one commit (removes and an add with ``dataChange``
  false: summed per key, the table says the same; no other file is touched, so no row is
  rewritten twice). Spark tasks read, sum and write (:mod:`speed_layer.rewrite`); the driver
  reads only the log. Each commit notes how far it rolled up, so a
  restarted job continues from there. A closed bucket can still have a few rows per key (in
  files closed at different minutes): readers sum per key anyway.
- **Minute compaction.** With the roll-up, the micro-batch files of each minute the stream
  has moved past become one file: the open buckets live in about ten files instead of one
  per micro-batch (600 at a micro-batch a second), and each query reads them.
- **Schema evolution.** A table created before columns were added to its schema (the
  attribution measures of ``speed/ctr``) gets them when the job opens it, as nullable
  columns: its older rows read null there (not measured), its roll-ups keep them null.
- **Maintenance** in a thread of the job's own, beside the micro-batches' commits, with its own
  handles (one writing process; :class:`speed_layer.job.SpeedBatchWriter`): the roll-ups above,
  and: delete buckets the batch layer covers
  (from both tables), merge each closed hour's roll-ups into one file, compact
  ``speed/late``, vacuum (full) files older than the retention; and the Delta log is
  checkpointed every ``lake.retention.CHECKPOINT_INTERVAL`` commits and cleaned past the
  retention (delta-rs's post-commit hook, from the table's properties).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from lake.append_table import AppendTable, add_action
from lake.coverage.model import Coverage, delta_rs_timestamp, in_intervals_sql
from lake.retention import retention_properties
from lake.storage import ensure_columns
from runtime.object_store import ObjectStoreSettings
from speed_layer.rewrite import Rewrite
from views.columns import DIMENSIONS, SKETCHES
from views.sketches import union_sketch

log = logging.getLogger("ctr.speed")

KEY: Final = ("bucket_start", *DIMENSIONS)
# speed/ctr's counts, summed per key: the events, then the attribution (speed_layer.attribution).
COUNTS: Final = ("impressions", "clicks", "attributed_clicks", "orphan_clicks", "repeat_clicks")
# Commit metadata of a roll-up: the files of buckets before this moment (ISO-8601) are rolled up.
ROLLED_UP_BEFORE: Final = "ctr.rolledUpBefore"
# Commit metadata of a micro-batch's speed/ctr commit: the event-time watermark (epoch ms) the
# next micro-batch runs under (speed_layer.job: a restarted job goes on from it).
NEXT_WATERMARK: Final = "ctr.nextWatermarkMs"
HOUR: Final = dt.timedelta(hours=1)
_HISTORY_SEARCHED: Final = 2_000  # commits looked through for the last roll-up at start


def table_properties(retention_hours: float) -> dict[str, str]:
    """Delta table properties of the speed tables: versions (as-of queries) and their files
    are kept ``retention_hours`` (whole minutes); the log is checkpointed and cleaned by its
    writer."""
    return retention_properties(log_hours=retention_hours, files_hours=retention_hours)


@dataclass(frozen=True)
class RollUp:
    """What a roll-up did: the buckets in [start, end) became ``rows_after`` rows."""

    start: dt.datetime | None
    end: dt.datetime
    rows_before: int
    rows_after: int


class SpeedTable(AppendTable):
    """One speed table at ``path``, held open between commits (its only writer): appends
    exactly once per (speed query, batch), rolls up, and maintains itself."""

    def __init__(
        self,
        path: str,
        store: ObjectStoreSettings,
        schema: pa.Schema,
        *,
        retention_hours: float,
        rewrite: Rewrite | None = None,
    ) -> None:
        """``rewrite``: how roll-ups and compactions rewrite files (Spark tasks:
        :func:`speed_layer.rewrite.spark_rewrite`); a table without one only appends."""
        super().__init__(path, store, schema, properties=table_properties(retention_hours))
        self.rewrite = rewrite

    def _ensure_properties(self, table: DeltaTable) -> None:
        """On opening the table: its properties, and the columns of ``schema`` it lacks (a
        table written before they were added), nullable."""
        super()._ensure_properties(table)
        added = ensure_columns(table, self.schema)
        if added:
            log.info("%s: columns added: %s", self.path, ", ".join(added))

    def rolled_up_before(self) -> dt.datetime | None:
        """Where the last roll-up ended (from its commit), None if none is in the recent log."""
        value = self._last_noted(ROLLED_UP_BEFORE)
        return None if value is None else dt.datetime.fromisoformat(value)

    def next_watermark_ms(self) -> int | None:
        """The watermark the last micro-batch's commit left for the next (None: none in the
        recent log)."""
        value = self._last_noted(NEXT_WATERMARK)
        return None if value is None else int(value)

    def _last_noted(self, key: str) -> str | None:
        """The newest commit metadata ``key`` among the recent commits (a restarted job's
        starting points)."""
        table = self.table
        if table is None:
            return None
        for commit in table.history(_HISTORY_SEARCHED):
            value = commit.get(key)
            if isinstance(value, str):
                return value
        return None

    def roll_up(self, start: dt.datetime | None, end: dt.datetime) -> RollUp | None:
        """Replace the files whose buckets the watermark has all closed since the last roll-up
        (newest bucket in [``start``, ``end``); before ``end`` if ``start`` is None) by one
        file of their rows summed per key, in one commit noting ``end``. A file that still
        holds an open bucket waits for a later roll-up, and no file is rewritten twice: a
        roll-up's file has its newest bucket before its ``end``, so the next one leaves it
        alone. (delta-rs's overwrite of the closed buckets copied the other rows of every file
        it touched into its new file, which then held closed and open buckets, so every
        roll-up rewrote all the rows not covered yet.) A single file (a minute the compaction
        made one already) is left as it is: the commit then only notes ``end``. None if
        ``start`` >= ``end``."""
        table = self.table
        if table is None or (start is not None and start >= end):
            return None
        files = [
            f
            for f in self._files(table)
            if f["max"] is not None and f["max"] < end and (start is None or f["max"] >= start)
        ]
        metadata = {ROLLED_UP_BEFORE: end.isoformat()}
        if len(files) > 1:
            rows_before, rows_after = self._replace(table, [files], metadata)
            return RollUp(start, end, rows_before, rows_after)
        # None or one file (a minute the compaction made one already): nothing to sum, only
        # where the roll-up reached, for a restarted job.
        self._commit(table, [], metadata)
        rows = sum(f["rows"] or 0 for f in files)
        return RollUp(start, end, rows, rows)

    def _files(self, table: DeltaTable) -> list[dict[str, Any]]:
        """The table's files: path, size, rows and their newest bucket (max)."""
        adds = table.get_add_actions(flatten=True)
        if adds.num_rows == 0:
            return []
        return [
            {"path": path, "size": size, "rows": rows, "max": high}
            for path, size, rows, high in zip(
                adds.column("path").to_pylist(),
                adds.column("size_bytes").to_pylist(),
                adds.column("num_records").to_pylist(),
                adds.column("max.bucket_start").to_pylist(),
                strict=True,
            )
        ]

    def _replace(
        self,
        table: DeltaTable,
        groups: Sequence[Sequence[dict[str, Any]]],
        metadata: dict[str, str],
    ) -> tuple[int, int]:
        """Replace each group of ``files`` by one file of their rows summed per key: the
        groups rewritten by Spark tasks (:mod:`speed_layer.rewrite`), then one commit of the
        removes and adds (``dataChange=false``: every reader sums per key, so the table says the
        same), with ``metadata``. Returns the rows before and after."""
        if not groups:
            return 0, 0
        if self.rewrite is None:
            raise RuntimeError(f"{self.path}: a SpeedTable needs a rewrite to roll up or compact")
        paths = [[f["path"] for f in files] for files in groups]
        done = self.rewrite(self.path, self.store, paths, self.schema, sum_per_key)
        now_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(
                path=f["path"], data_change=False, deletion_timestamp=now_ms, size=f["size"]
            )
            for files in groups
            for f in files
        ]
        actions += [add_action(f, data_change=False) for group in done for f in group.files]
        self._commit(table, actions, metadata)
        return sum(g.rows_in for g in done), sum(g.rows_out for g in done)

    def _commit(
        self, table: DeltaTable, actions: list[AddAction | RemoveAction], metadata: dict[str, str]
    ) -> None:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=self.schema,
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
        table.update_incremental()

    def compact_minutes(self, rolled_up_before: dt.datetime | None) -> int:
        """Replace the micro-batch files not rolled up yet (newest bucket from
        ``rolled_up_before`` on) by one file per minute of their newest bucket, for each minute
        before the newest file's (the stream has moved past it) that has several; returns the
        minutes compacted. A micro-batch file's newest bucket is the minute it was written in,
        so this leaves a file per minute where there were one per micro-batch (the open
        buckets' files, read by every query, until the watermark closes them), and a compacted
        minute is compacted again only if a later micro-batch's newest bucket falls in it (a
        replay). The roll-up takes the compacted files as it took their micro-batches'."""
        table = self.table
        if table is None:
            return 0
        per_minute = _per_period(
            (
                f
                for f in self._files(table)
                if f["max"] is not None
                and (rolled_up_before is None or f["max"] >= rolled_up_before)
            ),
            lambda t: t.replace(second=0, microsecond=0),
        )
        return self._merge_each(table, [files for _, files in per_minute[:-1]])

    def _merge_each(self, table: DeltaTable, groups: Sequence[Sequence[dict[str, Any]]]) -> int:
        """Replace each group of several files by one, in one commit; returns the groups
        replaced."""
        merged = [files for files in groups if len(files) > 1]
        self._replace(table, merged, {})
        return len(merged)

    def delete_covered(self, coverage: Coverage) -> int:
        """Delete the rows of buckets ``coverage`` holds; returns the rows deleted."""
        table = self.table
        if table is None or not coverage.intervals:
            return 0
        literal = delta_rs_timestamp
        bounds = [(literal(i.start), literal(i.end)) for i in coverage.intervals]
        metrics = table.delete(in_intervals_sql("bucket_start", bounds))
        return int(metrics.get("num_deleted_rows", 0) or 0)

    def merge_closed_hours(self, rolled_up_before: dt.datetime | None) -> int:
        """Replace the roll-ups' files of each closed hour before ``rolled_up_before`` (by
        their newest bucket) by one file, when there are several; returns the hours merged.
        Each hour is merged once, so this stays cheap."""
        table = self.table
        if table is None or rolled_up_before is None:
            return 0
        per_hour = _per_period(
            (f for f in self._files(table) if f["max"] is not None and f["max"] < rolled_up_before),
            lambda t: t.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0),
        )
        closed = [files for hour, files in per_hour if hour + HOUR <= rolled_up_before]
        return self._merge_each(table, closed)

    def reset(self) -> None:
        """Empty the table: a new version with no rows (history and readers unaffected)."""
        table = self.table
        if table is not None:
            write_deltalake(table, self.schema.empty_table(), mode="overwrite")


def _per_period(
    files: Iterable[dict[str, Any]], period: Callable[[dt.datetime], dt.datetime]
) -> list[tuple[dt.datetime, list[dict[str, Any]]]]:
    """``files`` with a newest bucket, grouped by the ``period`` it falls in, oldest first."""
    groups: dict[dt.datetime, list[dict[str, Any]]] = {}
    for f in files:
        groups.setdefault(period(f["max"]), []).append(f)
    return sorted(groups.items())


def sum_per_key(rows: pa.Table, counts: Sequence[str] = COUNTS) -> pa.Table:
    """One row per (bucket, dimensions): the ``counts`` summed (null where every row has
    null: not measured), the latest ``updated_at`` if the rows have one, and the union of the
    rows' :data:`views.columns.SKETCHES` if they have them (null where every row has null)."""
    aggregates = [(name, "sum") for name in counts]
    names = [*KEY, *counts]
    if "updated_at" in rows.column_names:
        aggregates.append(("updated_at", "max"))
        names.append("updated_at")
    sketched = [name for name in SKETCHES if name in rows.column_names]
    aggregates += [(name, "list") for name in sketched]
    names += sketched
    summed = rows.group_by(list(KEY), use_threads=False).aggregate(aggregates)
    summed = summed.rename_columns(names)
    for name in sketched:
        summed = summed.set_column(
            summed.schema.get_field_index(name), name, _unions(summed.column(name))
        )
    return summed


def _unions(lists: pa.ChunkedArray | pa.ListArray) -> pa.Array:
    """Each list of sketches as one: itself when it is the only one, null when all are. Only
    the lists of several sketches reach Python (a roll-up of a minute at 5,000 events/s: about
    a third of its 160,000 keys); the rest is taken in Arrow."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    n = len(lists)
    flat = pc.list_flatten(lists)
    present = pc.is_valid(flat)
    flat = flat.filter(present)
    if not len(flat):
        return pa.nulls(n, pa.binary())
    # The list each present sketch belongs to, ascending: each list's sketches are adjacent.
    owners = pc.list_parent_indices(lists).filter(present).to_numpy()
    counts = np.bincount(owners, minlength=n)
    # Each list's first present sketch (a list with none points anywhere: masked below).
    first = np.minimum(np.searchsorted(owners, np.arange(n)), len(flat) - 1)
    merged = flat.take(pa.array(first, mask=counts == 0))
    several = np.flatnonzero(counts > 1)
    if not len(several):
        return merged
    unioned = [union_sketch(flat.slice(first[i], counts[i]).to_pylist()) for i in several]
    mask = np.zeros(n, dtype=bool)
    mask[several] = True
    return pc.replace_with_mask(merged, pa.array(mask), pa.array(unioned, pa.binary()))


def total(rows: pa.Table, column: str) -> int:
    return int(pc.sum(rows[column]).as_py() or 0)
