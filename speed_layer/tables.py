"""The speed layer's tables, ``speed/ctr`` (partial counts) and ``speed/late`` (what it dropped),
written from the speed job's driver with delta-rs.

Why not delta-spark: a micro-batch's view is a few thousand rows already on the driver, and
delta-rs commits them in tens of milliseconds where a delta-spark commit costs a Spark job and
a snapshot update (:mod:`lake.append_table`, which the archiver's tables share). The speed job
is the only writer of both tables, in one process.

- **Append, exactly once.** Each micro-batch *appends* its counts per (bucket, dimensions) in
  one commit carrying the application transaction (speed query id, batch id); a batch whose
  transaction the table already holds (Spark replays the last batch after a crash) writes
  nothing. Readers sum the rows per key (the serving layer does).
- **Roll-up.** Once the watermark closes a bucket, no on-time row can reach it any more: the
  job replaces the rows of the buckets closed since its last roll-up by one row per key, in one
  commit (an overwrite of exactly those buckets). Each commit notes how far it rolled up, so a
  restarted job continues from there.
- **Schema evolution.** A table created before columns were added to its schema (the
  attribution measures of ``speed/ctr``) gets them when the job opens it, as nullable
  columns: its older rows read null there (not measured), its roll-ups keep them null.
- **Maintenance** in the job's own loop (one writer): delete buckets the batch layer covers
  (from both tables), merge each hour's minute roll-ups into one file, compact
  ``speed/late``, vacuum (full) files older than the retention; and the Delta log is
  checkpointed every ``lake.retention.CHECKPOINT_INTERVAL`` commits and cleaned past the
  retention (delta-rs's post-commit hook, from the table's properties).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.schema import Field

from lake.append_table import AppendTable
from lake.coverage import Coverage, delta_rs_timestamp, in_intervals_sql
from lake.retention import retention_properties
from views.columns import DIMENSIONS

log = logging.getLogger("ctr.speed")

KEY: Final = ("bucket_start", *DIMENSIONS)
# speed/ctr's counts, summed per key: the events, then the attribution (speed_layer.attribution).
COUNTS: Final = ("impressions", "clicks", "attributed_clicks", "orphan_clicks", "repeat_clicks")
# Commit metadata of a roll-up: every bucket before this moment (ISO-8601) is one row per key.
ROLLED_UP_BEFORE: Final = "ctr.rolledUpBefore"
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

    def __init__(self, path: str, schema: pa.Schema, *, retention_hours: float) -> None:
        super().__init__(path, schema, properties=table_properties(retention_hours))

    def _ensure_properties(self, table: DeltaTable) -> None:
        """On opening the table: its properties, and the columns of ``schema`` it lacks (a
        table written before they were added), nullable."""
        super()._ensure_properties(table)
        present = set(table.schema().to_arrow().names)
        missing = [f for f in self.schema if f.name not in present]
        if missing:
            table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in missing])
            log.info("%s: columns added: %s", self.path, ", ".join(f.name for f in missing))

    def rolled_up_before(self) -> dt.datetime | None:
        """Where the last roll-up ended (from its commit), None if none is in the recent log."""
        table = self.table
        if table is None:
            return None
        for commit in table.history(_HISTORY_SEARCHED):
            value = commit.get(ROLLED_UP_BEFORE)
            if isinstance(value, str):
                return dt.datetime.fromisoformat(value)
        return None

    def roll_up(
        self, start: dt.datetime | None, end: dt.datetime, *, marks: bool = True
    ) -> RollUp | None:
        """Replace the rows of buckets in [``start``, ``end``) (from the first bucket if
        ``start`` is None) by their sums per key, in one commit, which notes ``end`` as where
        the roll-ups reached unless ``marks`` is false (a merge of rows rolled up before).
        None if there was nothing."""
        table = self.table
        if table is None or (start is not None and start >= end):
            return None
        in_range = ds.field("bucket_start") < pa.scalar(end, pa.timestamp("us", tz="UTC"))
        predicate = f"bucket_start < {delta_rs_timestamp(end)}"
        if start is not None:
            in_range &= ds.field("bucket_start") >= pa.scalar(start, pa.timestamp("us", "UTC"))
            predicate = f"bucket_start >= {delta_rs_timestamp(start)} AND {predicate}"
        rows = table.to_pyarrow_dataset().to_table(filter=in_range)
        metadata = {ROLLED_UP_BEFORE: end.isoformat()} if marks else {}
        if rows.num_rows == 0:
            return RollUp(start, end, 0, 0)
        summed = sum_per_key(rows)
        write_deltalake(
            table,
            summed.cast(self.schema),
            mode="overwrite",
            predicate=predicate,
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
        return RollUp(start, end, rows.num_rows, summed.num_rows)

    def delete_covered(self, coverage: Coverage) -> int:
        """Delete the rows of buckets ``coverage`` holds; returns the rows deleted."""
        table = self.table
        if table is None or not coverage.intervals:
            return 0
        literal = delta_rs_timestamp
        bounds = [(literal(i.start), literal(i.end)) for i in coverage.intervals]
        metrics = table.delete(in_intervals_sql("bucket_start", bounds))
        return int(metrics.get("num_deleted_rows", 0) or 0)

    def merge_rolled_up_hours(self, rolled_up_before: dt.datetime | None) -> int:
        """Rewrite the rolled-up part of each hour (all of it for a closed hour, up to
        ``rolled_up_before`` for the current one) that spans more than one file as one file;
        returns the hours merged. Each roll-up leaves a file of its minutes: without this the
        current hour would pile up a small file a minute (the table's bytes a sawtooth with an
        hour's period), and a closed hour is merged once."""
        table = self.table
        if table is None or rolled_up_before is None:
            return 0
        files = table.get_add_actions(flatten=True)
        hour = dt.timedelta(hours=1)
        per_hour: dict[dt.datetime, int] = {}
        if files.num_rows == 0:
            return 0
        lows = files.column("min.bucket_start").to_pylist()
        highs = files.column("max.bucket_start").to_pylist()
        for low, high in zip(lows, highs, strict=True):
            if low is None or high is None or low >= rolled_up_before:
                continue
            first = low.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
            while first <= min(high, rolled_up_before):
                per_hour[first] = per_hour.get(first, 0) + 1
                first += hour
        merged = 0
        for start in sorted(per_hour):
            if per_hour[start] > 1 and start < rolled_up_before:
                self.roll_up(start, min(start + hour, rolled_up_before), marks=False)
                merged += 1
        return merged

    def reset(self) -> None:
        """Empty the table: a new version with no rows (history and readers unaffected)."""
        table = self.table
        if table is not None:
            write_deltalake(table, self.schema.empty_table(), mode="overwrite")


def sum_per_key(rows: pa.Table, counts: Sequence[str] = COUNTS) -> pa.Table:
    """One row per (bucket, dimensions): the ``counts`` summed (null where every row has
    null: not measured), the latest ``updated_at`` if the rows have one."""
    aggregates = [(name, "sum") for name in counts]
    names = [*KEY, *counts]
    if "updated_at" in rows.column_names:
        aggregates.append(("updated_at", "max"))
        names.append("updated_at")
    summed = rows.group_by(list(KEY), use_threads=False).aggregate(aggregates)
    return summed.rename_columns(names)


def total(rows: pa.Table, column: str) -> int:
    return int(pc.sum(rows[column]).as_py() or 0)
