"""The speed job: approximate CTR views of the last minutes, fresh within seconds.

A Structured Streaming query from the event topic: records are parsed with the shared
validator (invalid ones are skipped and counted; the archiver keeps them), the event-time
watermark trails the newest event by ``SPEED_WATERMARK``, and each micro-batch goes through the
same view function as the batch layer, :func:`views.ctr.ctr`. Buckets whose end the watermark
has passed are closed: their events are dropped and counted per bucket in ``speed/late``; the
rest are added to ``speed/ctr`` by a delta-spark MERGE on (bucket, dimensions). Both commits
carry (query id, batch id), so a micro-batch replayed after a crash changes nothing twice.

Approximate by design: no deduplication (a duplicated event counts twice until the batch layer
covers its bucket) and late events beyond the watermark are not counted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.compute as pc

from events.records import parse_records
from lake.catalog import SPEED_CTR, SPEED_LATE
from lake.maintenance import prune_speed
from lake.settings import LakeSettings
from lake.speed_status import write_status
from runtime.formats import read_delta, read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import KafkaLag, StreamProgress, batch_metadata, drive, query_id
from speed_layer.settings import SpeedSettings
from speed_layer.tables import append_late, merge_counts
from views.columns import DIMENSIONS
from views.ctr import ctr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ctr.speed")

BUCKET: Final = dt.timedelta(minutes=1)  # the view's bucket width
OBSERVATION: Final = "speed"


class SpeedStateError(RuntimeError):
    """speed/ctr holds counts from another streaming query (its checkpoint is gone)."""


def build_query(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: SpeedSettings,
    available_now: bool = False,
) -> StreamingQuery:
    """Start the speed query (it runs until stopped, or until caught up if available_now)."""
    from pyspark.sql import functions as F

    checkpoint = lake.checkpoint(settings.checkpoint_name)
    _check_fresh_start(spark, lake, checkpoint)
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
        .select("event_time", "event_type", *DIMENSIONS)
        .withWatermark("event_time", settings.watermark)
    )
    writer = (
        events.writeStream.foreachBatch(BatchWriter(lake, checkpoint, settings))
        .option("checkpointLocation", checkpoint)
        .queryName("ctr-speed")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return writer.start()


def _check_fresh_start(spark: SparkSession, lake: LakeSettings, checkpoint: str) -> None:
    """A new checkpoint re-reads the log from the start: refuse to add that to old counts."""
    from speed_layer.tables import exists

    path = SPEED_CTR.path(lake)
    if (Path(checkpoint) / "metadata").exists() or not exists(spark, path):
        return
    if not read_delta(spark, path).isEmpty():
        raise SpeedStateError(
            f"{path} holds counts but the speed checkpoint {checkpoint} is missing, so the job "
            "would count the retained log again; run `ctr speed --reset` to rebuild speed/ctr "
            "from the log (the batch layer is unaffected)"
        )


class BatchWriter:
    """foreachBatch function: view of the micro-batch, split at the watermark, two commits."""

    def __init__(self, lake: LakeSettings, checkpoint: str, settings: SpeedSettings) -> None:
        self.ctr_path = SPEED_CTR.path(lake)
        self.late_path = SPEED_LATE.path(lake)
        self.lake = lake
        self.checkpoint = checkpoint
        self.settings = settings
        self.late_events = 0  # since this process started
        self._last_maintenance = time.monotonic()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        app_id = f"ctr-speed-{query_id(self.checkpoint)}"
        metadata = batch_metadata(self.checkpoint, batch_id)
        # The view of a micro-batch is small (counts per minute and dimensions): split it here,
        # then write each part; a replayed batch writes nothing twice (Delta transactions).
        started = time.perf_counter()
        view = batch.transform(ctr).toArrow()
        viewed = time.perf_counter()
        stamp = pa.scalar(metadata.timestamp_ms * 1000, pa.timestamp("us", tz="UTC"))
        on_time, late = split_late(view, metadata.watermark_ms)
        if late.num_rows:
            late = late.append_column("batch_id", pa.array([batch_id] * late.num_rows, pa.int64()))
            late = late.append_column("recorded_at", pa.array([stamp] * late.num_rows))
            append_late(spark, self.late_path, spark.createDataFrame(late), app_id, batch_id)
            self.late_events += int(pc.sum(late["impressions"]).as_py() or 0)
            self.late_events += int(pc.sum(late["clicks"]).as_py() or 0)
        if on_time.num_rows:
            on_time = on_time.append_column("updated_at", pa.array([stamp] * on_time.num_rows))
            starts = on_time["bucket_start"]
            bounds = (pc.min(starts).as_py(), pc.max(starts).as_py())
            merge_counts(
                spark,
                self.ctr_path,
                spark.createDataFrame(on_time),
                app_id=app_id,
                batch_id=batch_id,
                buckets=bounds,
            )
        log.debug(
            "batch %d: view %.0f ms (%d rows), writes %.0f ms",
            batch_id, (viewed - started) * 1000, view.num_rows,
            (time.perf_counter() - viewed) * 1000,
        )  # fmt: skip
        if time.monotonic() - self._last_maintenance >= self.settings.maintenance_seconds:
            self._last_maintenance = time.monotonic()
            maintain(spark, self.lake, self.settings)


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


def maintain(spark: SparkSession, lake: LakeSettings, settings: SpeedSettings) -> None:
    """Drop buckets the batch layer now covers, compact small files, vacuum old ones."""
    from lake.maintenance import compact_and_vacuum

    try:
        pruned = prune_speed(spark, lake)
        report = compact_and_vacuum(
            spark, lake, SPEED_CTR.name, retention_hours=settings.vacuum_retention_hours
        )
        log.info(
            "speed/ctr maintenance: %d covered rows pruned, %s files compacted",
            pruned,
            report.files_removed if report else 0,
        )
    except Exception as exc:  # maintenance must never stop the stream
        log.warning("speed/ctr maintenance failed (will retry later): %s", exc)


def reset(spark: SparkSession, lake: LakeSettings, settings: SpeedSettings) -> None:
    """Forget the speed job's progress: empty speed/ctr and speed/late, delete the checkpoint."""
    import shutil

    from speed_layer.tables import reset as reset_table

    reset_table(spark, SPEED_CTR.path(lake), SPEED_CTR.spark_schema())
    reset_table(spark, SPEED_LATE.path(lake), SPEED_LATE.spark_schema())
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
    query = build_query(
        spark,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
    )
    lag = KafkaLag(kafka)

    def report(progress: StreamProgress) -> None:
        behind = lag.behind(progress.end_offsets)
        progress = dataclasses.replace(
            progress, offsets_behind=behind if behind is not None else progress.offsets_behind
        )
        write_status(lake, progress)
        log.info(
            "batch %d: %d rows, %.0f rows/s in, %.0f rows/s processed, %d ms, %s offsets behind",
            progress.batch_id, progress.input_rows, progress.input_rows_per_second,
            progress.processed_rows_per_second, progress.batch_duration_ms,
            "?" if progress.offsets_behind is None else progress.offsets_behind,
        )  # fmt: skip
        if on_progress is not None:
            on_progress(progress)

    try:
        return drive(query, "the speed job", on_progress=report, should_stop=should_stop)
    finally:
        lag.close()


def _ms(delta: dt.timedelta) -> int:
    return int(delta.total_seconds() * 1000)
