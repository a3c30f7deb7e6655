"""The speed job: approximate CTR views of the last minutes, fresh within seconds.

A Structured Streaming query from the event topic: records are parsed with the shared
validator (invalid ones are skipped and counted; the archiver keeps them), the event-time
watermark trails the newest event by ``SPEED_WATERMARK``, and each micro-batch's events come to
the driver in one Spark job (a few thousand rows: cheaper than a Spark aggregation's shuffle),
where the view's definition counts them (:func:`views.ctr.ctr_arrow`, held equal to the batch
layer's :func:`views.ctr.ctr` by a test, as the archiver's arrivals are). Buckets whose end
the watermark has passed are closed: their events are dropped and counted per bucket in
``speed/late``; the rest are appended to ``speed/ctr`` as partial counts per (bucket,
dimensions), from the driver with delta-rs (:mod:`speed_layer.tables`). Both commits carry
(query id, batch id), so a micro-batch replayed after a crash changes nothing twice. The job
also keeps ``speed/ctr`` small: it rolls up the files of closed buckets (summed per key),
deletes what the batch layer covers, and vacuums, between micro-batches (one writer).

Version 3 of ``ctr`` attributes clicks to their impressions (within an hour after them, in
the impression's bucket and dimensions). The speed job approximates it without a
stream-stream join, which would hold an hour of impressions in Spark's state and delay them: the
driver keeps the impressions of the open buckets (:mod:`speed_layer.attribution`) and, per
micro-batch, adds ``attributed_clicks``, ``repeat_clicks`` (on the impression's key) and
``orphan_clicks`` (on the click's key) to the rows it appends; ``clicks`` stays every click
event in its own bucket, for versions 1 and 2. Summed per key, attributed clicks never exceed
impressions.

Approximate by design: no deduplication (a duplicated event counts twice until the batch layer
covers its bucket) and late events beyond the watermark are not counted. Attribution: a click
whose impression came more than about the watermark before it (its bucket closed), arrives
after it, or was seen before the job restarted (the driver's state starts empty) counts as an
orphan where the batch layer attributes it: orphans overstated, attributed and repeat clicks
understated, until the batch layer covers those buckets.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from events.records import parse_records
from lake.catalog import SPEED_CTR, SPEED_LATE
from lake.coverage.log import read_runs
from lake.registry import read_registry
from lake.settings import LakeSettings
from lake.speed_status import write_status
from lake.storage import is_delta, open_delta
from runtime.connectors import read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import (
    KafkaLag,
    Periodic,
    PhaseClock,
    RecentPhases,
    StreamProgress,
    batch_metadata,
    drive,
    query_id,
)
from runtime.times import EPOCH
from speed_layer.attribution import MEASURES, Attribution
from speed_layer.settings import SpeedSettings
from speed_layer.tables import KEY, SpeedTable, sum_per_key, total
from views.columns import DIMENSIONS, SKETCHES
from views.ctr import ctr_arrow
from views.definitions import versions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ctr.speed")

BUCKET: Final = dt.timedelta(minutes=1)  # the view's bucket width
OBSERVATION: Final = "speed"
# The attribution window of the version of ``ctr`` that attributes clicks (version 3).
ATTRIBUTION: Final = next(d.attribution for d in versions("ctr") if d.attribution is not None)


class SpeedStateError(RuntimeError):
    """speed/ctr holds counts from another streaming query (its checkpoint is gone)."""


def build_query(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: SpeedSettings,
    available_now: bool = False,
    writer: BatchWriter | None = None,
) -> StreamingQuery:
    """Start the speed query (it runs until stopped, or until caught up if available_now)."""
    from pyspark.sql import functions as F

    checkpoint = lake.checkpoint(settings.checkpoint_name)
    writer = writer or BatchWriter(lake, checkpoint, settings)
    _check_fresh_start(lake, checkpoint)
    raw = read_kafka(
        spark,
        kafka,
        stream=True,
        startingOffsets=settings.starting_offsets,
        maxOffsetsPerTrigger=str(settings.max_offsets_per_trigger),
        failOnDataLoss=str(settings.fail_on_data_loss).lower(),
    )
    events = (
        parse_records(raw)
        .observe(
            OBSERVATION,
            F.count(F.lit(1)).alias("records"),
            F.count(F.when(F.col("reason").isNotNull(), 1)).alias("invalid"),
        )
        .where(F.col("reason").isNull())
        .select("event_time", "event_type", "impression_id", *DIMENSIONS, "user_id")
        .withWatermark("event_time", settings.watermark)
    )
    stream = (
        events.writeStream.foreachBatch(writer)
        .option("checkpointLocation", checkpoint)
        .queryName("ctr-speed")
    )
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return stream.start()


def _check_fresh_start(lake: LakeSettings, checkpoint: str) -> None:
    """A new checkpoint re-reads the log from the start: refuse to add that to old counts."""

    path = SPEED_CTR.path(lake)
    if (Path(checkpoint) / "metadata").exists() or not is_delta(path):
        return
    if open_delta(path).to_pyarrow_dataset().head(1).num_rows:
        raise SpeedStateError(
            f"{path} holds counts but the speed checkpoint {checkpoint} is missing, so the job "
            "would count the retained log again; run `ctr speed --reset` to rebuild speed/ctr "
            "from the log (the batch layer is unaffected)"
        )


class BatchWriter:
    """foreachBatch function: the micro-batch's view, split at the watermark, appended to
    ``speed/late`` and ``speed/ctr`` with the clicks attributed to the open impressions;
    between batches, the roll-up and maintenance."""

    def __init__(self, lake: LakeSettings, checkpoint: str, settings: SpeedSettings) -> None:
        retention = settings.vacuum_retention_hours
        self.ctr = SpeedTable(SPEED_CTR.path(lake), SPEED_CTR.schema, retention_hours=retention)
        self.late = SpeedTable(SPEED_LATE.path(lake), SPEED_LATE.schema, retention_hours=retention)
        self.lake = lake
        self.checkpoint = checkpoint
        self.settings = settings
        self.late_events = 0  # since this process started
        # The open buckets' impressions (lost on restart: see the module docstring).
        self.attribution = Attribution(ATTRIBUTION)
        # Per micro-batch: milliseconds per phase of this callback (and the view's row count).
        self.phases = RecentPhases()
        # The roll-ups reached this bucket: files of earlier buckets are rolled up (read from
        # speed/ctr's log at start).
        self._rolled_up_before: dt.datetime | None = None
        self._rolled_up_known = False
        self._rollup = Periodic(settings.rollup_seconds)
        # The first pass a minute after the start: see Periodic.
        self.maintenance_due = Periodic(settings.maintenance_seconds, first_after_s=60)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        clock = PhaseClock()
        app_id = f"ctr-speed-{query_id(self.checkpoint)}"
        metadata = batch_metadata(self.checkpoint, batch_id)
        if self.ctr.committed(app_id, batch_id):
            # A replay of a batch whose counts are in (late ones are written first): nothing
            # to compute or write.
            log.info("batch %d: already in speed/ctr (replayed after a restart)", batch_id)
            return
        # One Spark job: the Kafka read, parsing and validation, the events' columns to the
        # driver; the view of them and the attribution there (a micro-batch is thousands of
        # rows: a Spark aggregation's shuffle cost more than the rows' transfer).
        events = attribution_events(batch).toArrow()
        clock.lap("events")
        view = ctr_arrow(events, reach=True)
        clock.lap("view")
        stamp = pa.scalar(metadata.timestamp_ms * 1000, pa.timestamp("us", tz="UTC"))
        on_time, late = split_late(view, metadata.watermark_ms)
        clock.lap("split")
        open_from = _ms(closed_before(metadata.watermark_ms) - EPOCH)
        on_time = with_attribution(on_time, self.attribution.process(events, open_from))
        clock.lap("attribution")
        if late.num_rows:
            late = late.append_column("batch_id", pa.array([batch_id] * late.num_rows, pa.int64()))
            late = late.append_column("recorded_at", pa.array([stamp] * late.num_rows))
            if self.late.append(late, app_id=app_id, version=batch_id):
                self.late_events += total(late, "impressions") + total(late, "clicks")
            clock.lap("late_write")
        if on_time.num_rows:
            on_time = on_time.append_column("updated_at", pa.array([stamp] * on_time.num_rows))
            self.ctr.append(on_time, app_id=app_id, version=batch_id)
            clock.lap("ctr_write")
        self.maintain(metadata.watermark_ms, clock)
        self.phases.record(
            batch_id,
            {"view_rows": view.num_rows, "open_impressions": self.attribution.impressions,
             **clock.ms},
        )  # fmt: skip

    def maintain(self, watermark_ms: int, clock: PhaseClock | None = None) -> None:
        """Roll up the buckets the watermark closed and compact the micro-batch files of the
        minutes past (every ``rollup_seconds``); delete what the batch layer covers and vacuum
        (every ``maintenance_seconds``). Never stops the stream: a failure is logged and tried
        again next time."""
        clock = clock or PhaseClock()
        if watermark_ms > 0 and self._rollup.due():
            self._roll_up(closed_before(watermark_ms))
            clock.lap("rollup")
        if self.maintenance_due.due():
            self._maintenance()
            clock.lap("maintenance")

    def _roll_up(self, end: dt.datetime) -> None:
        try:
            if not self._rolled_up_known:
                self._rolled_up_before = self.ctr.rolled_up_before()
                self._rolled_up_known = True
            done = self.ctr.roll_up(self._rolled_up_before, end)
            if done is not None:
                self._rolled_up_before = end
                log.info(
                    "speed/ctr roll-up of buckets before %s: %d rows -> %d",
                    f"{end:%Y-%m-%d %H:%M}", done.rows_before, done.rows_after,
                )  # fmt: skip
            compacted = self.ctr.compact_minutes(self._rolled_up_before)
            if compacted:
                log.info("speed/ctr: micro-batch files compacted, %d minute(s)", compacted)
        except Exception as exc:  # maintenance must never stop the stream
            log.warning("speed/ctr roll-up failed (will retry): %s", exc)

    def _maintenance(self) -> None:
        try:
            # What the published version covers: the serving layer answers those buckets from
            # the batch layer, so their speed rows are never read again.
            published = read_registry(self.lake).published("ctr")
            coverage = read_runs(self.lake).of(published.key)
            pruned = self.ctr.delete_covered(coverage)
            merged = self.ctr.merge_closed_hours(self._rolled_up_before)
            vacuumed = self.ctr.vacuum()
            log.info(
                "speed/ctr maintenance: %d covered rows deleted, %d closed hours merged to a "
                "file each, %d files vacuumed",
                pruned, merged, vacuumed,
            )  # fmt: skip
            # speed/late is read for the minutes no batch run covered yet (drift): the covered
            # ones are forgotten, the rest (a file per batch with late events) compacted.
            late_pruned = self.late.delete_covered(coverage)
            log.info("speed/late maintenance: %d covered rows deleted, %s",
                     late_pruned, self.late.maintain())  # fmt: skip
        except Exception as exc:  # maintenance must never stop the stream
            log.warning("speed/ctr maintenance failed (will retry later): %s", exc)


def attribution_events(batch: DataFrame) -> DataFrame:
    """The micro-batch's events as the attribution takes them
    (:data:`speed_layer.attribution.EVENTS_SCHEMA`): impression ids hashed to 64 bits in Spark,
    so the driver gets integers."""
    from pyspark.sql import functions as F

    return batch.select(
        F.xxhash64("impression_id").alias("impression"),
        "event_type",
        "event_time",
        F.unix_millis("event_time").alias("event_ms"),
        *DIMENSIONS,
        "user_id",  # reach (views.ctr.ctr_arrow's sketches)
    )


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


def reset(lake: LakeSettings, settings: SpeedSettings) -> None:
    """Forget the speed job's progress: empty speed/ctr and speed/late, delete the checkpoint."""
    import shutil

    retention = settings.vacuum_retention_hours
    for table in (SPEED_CTR, SPEED_LATE):
        SpeedTable(table.path(lake), table.schema, retention_hours=retention).reset()
    shutil.rmtree(lake.checkpoint(settings.checkpoint_name), ignore_errors=True)


def run(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: SpeedSettings,
    available_now: bool = False,
    on_progress: Callable[[StreamProgress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Run the speed job until caught up (available_now) or told to stop; returns rows read."""
    writer = BatchWriter(lake, lake.checkpoint(settings.checkpoint_name), settings)
    query = build_query(
        spark,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
        writer=writer,
    )
    lag = KafkaLag(kafka)

    def report(progress: StreamProgress) -> None:
        clock = PhaseClock()
        behind = lag.behind(progress.end_offsets)
        progress = dataclasses.replace(
            progress, offsets_behind=behind if behind is not None else progress.offsets_behind
        )
        clock.lap("lag")
        # Where the batch's time went: Spark's phases of the trigger (addBatch is the callback),
        # the callback's own phases, and (from this report) asking the lag, writing the status.
        phases = {**writer.phases.of(progress), **clock.ms}
        write_status(lake, progress, phases=phases)
        clock.lap("status")
        log.info(
            "batch %d: %d rows, %.0f rows/s in, %.0f rows/s processed, %d ms, %s offsets behind",
            progress.batch_id, progress.input_rows, progress.input_rows_per_second,
            progress.processed_rows_per_second, progress.batch_duration_ms,
            "?" if progress.offsets_behind is None else progress.offsets_behind,
        )  # fmt: skip
        log.info("batch %d phases (ms): %s", progress.batch_id,
                 json.dumps({**phases, **clock.ms}))  # fmt: skip
        if on_progress is not None:
            on_progress(progress)

    try:
        return drive(query, "the speed job", on_progress=report, should_stop=should_stop)
    finally:
        lag.close()


def _ms(delta: dt.timedelta) -> int:
    return int(delta.total_seconds() * 1000)
