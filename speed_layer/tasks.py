"""A speed-job task's share of a micro-batch: count it, split it at the watermark, attribute
its clicks, write its files; the driver then only commits what the tasks describe.

The micro-batch's events stay in the tasks that parsed them (one per core, whole Kafka
partitions each). A task counts its events (:func:`views.ctr.ctr_arrow`: a partial count per
bucket and dimensions, reach sketches included), closes the buckets the batch's watermark has
passed (the driver reads it from the checkpoint before the job: :func:`split_late`), attributes
each partition's clicks against that partition's state (:mod:`speed_layer.state`), and writes
one Parquet file of ``speed/ctr`` rows and one of ``speed/late`` rows
(:func:`lake.data_files.write_files`). It returns only the files' descriptions and one summary
row (late events, the state it changed, its phases): a few hundred bytes per task, whatever
the micro-batch's size. Readers sum the partial counts per key already, so two tasks' rows of
one key need no merging.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from events.records import parse
from lake.catalog import SPEED_CTR, SPEED_LATE
from lake.data_files import FILES_SCHEMA, DataFile, write_files
from runtime.object_store import ObjectStoreSettings
from runtime.streaming import PhaseClock
from runtime.times import EPOCH
from speed_layer import state
from speed_layer.attribution import INCREMENTS_SCHEMA, MEASURES
from speed_layer.tables import KEY, sum_per_key, total
from views.columns import DIMENSIONS, SKETCHES
from views.ctr import ctr_arrow

BUCKET: Final = dt.timedelta(minutes=1)  # the view's bucket width
# What a task returns: a row per data file written, and one summary row (JSON).
TASK_SCHEMA: Final = pa.schema([*FILES_SCHEMA, ("summary", pa.string())])
SUMMARY: Final = "summary"  # the summary row's ``table``
ViewFunction = Callable[..., pa.Table]  # views.ctr.ctr_arrow's signature


@dataclass(frozen=True)
class MicroBatch:
    """What the driver tells every task of a micro-batch (fixed for its replays)."""

    batch_id: int
    watermark_ms: int  # the event-time watermark the batch runs under (0: none yet)
    # The batch's processing time: speed/ctr's updated_at, and the reference time of the
    # validator's far-future check (so a replay parses the records alike).
    timestamp_ms: int
    ctr_root: str | None  # where to write speed/ctr's files (None: the table holds the batch)
    late_root: str | None  # speed/late's (None: the table holds the batch)
    state_root: str  # the attribution state (speed_layer.state)
    # The lake's object store (the tables' roots and the state's may be on it): the tasks
    # take it from here, not from their executor's environment.
    store: ObjectStoreSettings
    query: str  # the streaming query's id
    window: dt.timedelta  # the attribution window
    # Per Kafka partition, the last micro-batch that changed its state, as far as the driver
    # knows (a partition not named: the task finds out).
    previous: dict[int, int] = field(default_factory=dict)
    # Change files between two snapshots of a partition's state (SpeedSettings).
    snapshot_every: int = state.SNAPSHOT_EVERY

    @property
    def open_from_ms(self) -> int:
        return open_from_ms(self.watermark_ms)


def count_and_write(
    batches: Iterator[pa.RecordBatch], *, plan: MicroBatch, view_of: ViewFunction = ctr_arrow
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function, one task's share of a micro-batch (the Kafka source's
    :data:`events.records.KAFKA_COLUMNS`): see the module's docstring. ``view_of``: the view's
    definition (the driver passes the one it holds). Yields :data:`TASK_SCHEMA` rows."""
    clock = PhaseClock()
    parsed = [parse(b, now_ms=plan.timestamp_ms) for b in batches if b.num_rows]
    if not parsed:
        return
    events = pa.concat_tables([p.events for p in parsed])
    records = sum(p.events.num_rows + p.rejected.num_rows for p in parsed)
    clock.lap("parse")
    view = view_of(events, reach=True)
    clock.lap("view")
    on_time, late = split_late(view, plan.watermark_ms)
    increments, summary = _attribute(attribution_events(events), plan)
    clock.lap("attribution")
    on_time = with_attribution(on_time, increments)
    clock.lap("merge")
    files = _write(plan, on_time, late)
    clock.lap("write")
    newest = pc.max(events["event_time"]).as_py() if events.num_rows else None
    summary |= {
        "records": records,
        "invalid": records - events.num_rows,
        "events": events.num_rows,
        "newest_event_ms": None if newest is None else _ms(newest - EPOCH),
        "view_rows": view.num_rows,
        "late_events": total(late, "impressions") + total(late, "clicks") if late.num_rows else 0,
        "task_ms": clock.ms,
    }
    answer: list[dict[str, object]] = [dict(f) for f in files]
    answer.append({"table": SUMMARY, "summary": json.dumps(summary)})
    yield pa.RecordBatch.from_pylist(answer, schema=TASK_SCHEMA)


def _write(plan: MicroBatch, on_time: pa.Table, late: pa.Table) -> list[DataFile]:
    """The task's files of speed/late (late counts per bucket) and speed/ctr (partial counts
    per key), for the tables that do not hold the batch yet."""
    stamp = pa.scalar(plan.timestamp_ms * 1000, pa.timestamp("us", tz="UTC"))
    files: list[DataFile] = []
    if plan.late_root is not None and late.num_rows:
        n = late.num_rows
        late = late.append_column("batch_id", pa.array(np.full(n, plan.batch_id), pa.int64()))
        late = late.append_column("recorded_at", pa.array([stamp] * n))
        schema = SPEED_LATE.schema
        files += write_files(
            SPEED_LATE.name, plan.late_root, plan.store, late.select(schema.names).cast(schema)
        )
    if plan.ctr_root is not None and on_time.num_rows:
        rows = on_time.append_column("updated_at", pa.array([stamp] * on_time.num_rows))
        schema = SPEED_CTR.schema
        rows = pa.table(
            [rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
             for f in schema],
            schema=schema,
        )  # fmt: skip
        files += write_files(SPEED_CTR.name, plan.ctr_root, plan.store, rows)
    return files


def attribution_events(events: pa.Table) -> pa.Table:
    """master/events rows as the attribution takes them
    (:data:`speed_layer.attribution.EVENTS_SCHEMA`, and the Kafka partition): the impression id
    hashed to 64 bits (the same in every process: SipHash with pandas' fixed key), the event
    time in epoch milliseconds."""
    from pandas.util import hash_array  # type: ignore[import-untyped]

    ids = events["impression_id"].to_numpy(zero_copy_only=False)
    hashes = hash_array(np.asarray(ids, dtype=object)).view(np.int64)
    millis = pc.divide(events["event_time"].cast(pa.int64()), 1000)
    return pa.table(
        {
            "kafka_partition": events["kafka_partition"],
            "impression": pa.array(hashes, pa.int64()),
            "event_type": events["event_type"],
            "event_ms": millis,
            **{d: events[d] for d in DIMENSIONS},
        }
    )


def _attribute(events: pa.Table, plan: MicroBatch) -> tuple[pa.Table, dict[str, object]]:
    """Each Kafka partition's clicks attributed against its state: the increments, and what
    the state did (partitions changed, open impressions, files read)."""
    partitions = events["kafka_partition"]
    distinct = sorted(pc.unique(partitions).to_pylist())
    increments = []
    changed: dict[str, int] = {}
    held = files_read = snapshots = 0
    for partition in distinct:
        one = len(distinct) == 1
        rows = events if one else events.filter(pc.equal(partitions, partition))
        done = state.attribute(
            plan.state_root,
            plan.store,
            plan.query,
            int(partition),
            plan.batch_id,
            rows,
            plan.open_from_ms,
            plan.previous.get(int(partition)),
            plan.window,
            snapshot_every=plan.snapshot_every,
        )
        increments.append(done.increments)
        held += done.open_impressions
        files_read += done.files_read
        snapshots += done.snapshotted
        if done.saved:
            changed[str(partition)] = plan.batch_id
    table = pa.concat_tables(increments) if increments else INCREMENTS_SCHEMA.empty_table()
    return table, {
        "state": changed,
        "open_impressions": held,
        "state_files_read": files_read,
        "state_snapshots": snapshots,
    }


def with_attribution(view: pa.Table, increments: pa.Table) -> pa.Table:
    """``speed/ctr``'s counts of a micro-batch: the view's rows of open buckets (no
    attribution measures: zero) and the attribution's increments (no impressions or clicks:
    zero; no sketches: null), one row per key, with the view's sketches if it has them."""
    types = {f.name: f.type for f in SPEED_CTR.schema}
    sketched = [name for name in SKETCHES if name in view.column_names]
    counts = ["impressions", "clicks", *MEASURES]
    columns = [*KEY, *counts, *sketched]

    def complete(rows: pa.Table) -> pa.Table:
        zeros = pa.array(np.zeros(rows.num_rows, np.int64))
        nulls = pa.nulls(rows.num_rows, pa.binary())

        def column(c: str) -> pa.Array | pa.ChunkedArray:
            if c in rows.column_names:
                return rows[c].cast(types[c])
            return nulls if c in sketched else zeros

        return pa.table({c: column(c) for c in columns})

    if increments.num_rows == 0:
        return complete(view)
    both = pa.concat_tables([complete(view), complete(increments)])
    return sum_per_key(both, counts)


def open_from_ms(watermark_ms: int) -> int:
    """:func:`closed_before` in epoch milliseconds."""
    return _ms(closed_before(watermark_ms) - EPOCH)


def closed_before(watermark_ms: int) -> dt.datetime:
    """The start of the first open bucket: every bucket before it is closed (its end is at or
    before the watermark), the rule :func:`split_late` applies."""
    bucket_ms = _ms(BUCKET)
    start_ms = watermark_ms // bucket_ms * bucket_ms
    return EPOCH + dt.timedelta(milliseconds=start_ms)


def split_late(view: pa.Table, watermark_ms: int) -> tuple[pa.Table, pa.Table]:
    """(rows of open buckets, late counts per closed bucket) of a micro-batch's view rows.

    A bucket is closed once the watermark reaches its end (Spark's rule for event-time windows):
    its rows in this batch are late events, summed per bucket into ``speed/late``'s first
    three columns.
    """
    if watermark_ms <= 0 or view.num_rows == 0:
        return view, _late_counts(view.schema, None)
    close_before_us = (watermark_ms - _ms(BUCKET)) * 1000
    starts = view["bucket_start"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    closed = pc.less_equal(starts, close_before_us)
    return view.filter(pc.invert(closed)), _late_counts(view.schema, view.filter(closed))


def _late_counts(schema: pa.Schema, closed: pa.Table | None) -> pa.Table:
    if closed is None or closed.num_rows == 0:
        return pa.table(
            {"bucket_start": pa.array([], schema.field("bucket_start").type),
             "impressions": pa.array([], pa.int64()), "clicks": pa.array([], pa.int64())}
        )  # fmt: skip
    summed = closed.group_by("bucket_start").aggregate([("impressions", "sum"), ("clicks", "sum")])
    return summed.rename_columns(["bucket_start", "impressions", "clicks"]).sort_by("bucket_start")


def _ms(delta: dt.timedelta) -> int:
    return int(delta.total_seconds() * 1000)
