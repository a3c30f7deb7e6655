"""The archiver: every Kafka record, exactly once, in the master dataset.

A Structured Streaming query from the event topic. Each micro-batch is parsed with the ingest
validator; valid events are appended to ``master/events`` (partitioned by ``event_date``) and
the rest to ``master/rejected`` with the reason and the raw bytes. Spark's ``kafka`` source
reads, delta-spark writes; both writes are idempotent Delta commits keyed by (query id, batch
id) (``txnAppId``/``txnVersion``): after a crash Spark replays the unfinished batch with the same
offsets and whatever was already committed is skipped, so every (partition, offset) lands
exactly once. A third commit, idempotent the same way, appends the batch's valid events counted
per minute bucket to ``master/arrivals`` with the master/events version that holds them: how the
serving layer and `ctr batch --stale` learn that a bucket a batch run covered received events
since (:mod:`lake.staleness`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from events.records import EVENTS_SCHEMA, REJECTED_SCHEMA, parse_records
from lake.arrivals import record_arrivals
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from master_dataset.settings import ArchiverSettings
from runtime.formats import read_kafka, write_delta
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import PhaseClock, RecentPhases, StreamProgress, drive, query_id

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ctr.archiver")


def build_query(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: ArchiverSettings,
    available_now: bool = False,
    batch_writer: BatchWriter | None = None,
) -> StreamingQuery:
    """Start the archiving query (it runs until stopped, or until caught up if available_now)."""

    checkpoint = lake.checkpoint(settings.checkpoint_name)
    raw = read_kafka(
        spark,
        kafka,
        stream=True,
        startingOffsets=settings.starting_offsets,
        maxOffsetsPerTrigger=str(settings.max_offsets_per_trigger),
        failOnDataLoss=str(settings.fail_on_data_loss).lower(),
    )
    parsed = parse_records(raw)
    writer = parsed.writeStream.foreachBatch(batch_writer or BatchWriter(lake, checkpoint))
    writer = writer.option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return writer.queryName("ctr-archiver").start()


class BatchWriter:
    """foreachBatch function: the parsed batch's valid rows to master/events, the rest to
    master/rejected, then the valid rows' arrivals; each commit idempotent under (query id,
    batch id). ``phases`` keeps, for the last few batches, the milliseconds of each write (the
    first also reads Kafka and parses: the batch is computed once, by it, and cached)."""

    def __init__(self, lake: LakeSettings, checkpoint: str) -> None:
        self.lake = lake
        self.checkpoint = checkpoint
        self.phases = RecentPhases()
        self._events_log = _VersionReader(lake.events)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        lake = self.lake
        clock = PhaseClock()
        app_id = f"ctr-archiver-{query_id(self.checkpoint)}"
        batch = batch.persist()
        try:
            valid = batch.where("reason IS NULL").select(*EVENTS_SCHEMA.names)
            write_delta(
                valid,
                lake.events,
                partition_by=MASTER_EVENTS.partition_by,
                txn=(app_id, batch_id),
            )
            clock.lap("read_parse_events_write")
            write_delta(
                batch.where("reason IS NOT NULL").select(*REJECTED_SCHEMA.names),
                lake.rejected,
                txn=(app_id, batch_id),
            )
            clock.lap("rejected_write")
            version = self._events_log.latest()
            clock.lap("events_version")
            record_arrivals(
                valid,
                lake,
                events_version=version,
                txn=(app_id, batch_id),
                archived_at=dt.datetime.now(dt.UTC),
            )
            clock.lap("arrivals_write")
        finally:
            batch.unpersist()
        self.phases.record(batch_id, clock.ms)


class _VersionReader:
    """The latest version of a Delta table, read with delta-rs from the log's new entries only
    (one handle, updated incrementally)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._handle: DeltaTable | None = None

    def latest(self) -> int:
        from deltalake import DeltaTable

        if self._handle is None:
            self._handle = DeltaTable(self.path)
        else:
            self._handle.update_incremental()
        return self._handle.version()


def run(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: ArchiverSettings,
    available_now: bool = False,
    on_progress: Callable[[StreamProgress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Run the archiver until caught up (available_now) or told to stop; returns rows archived.
    Each batch's phases (ms) are logged, and reach ``on_progress`` as ``progress.phases_ms``."""
    writer = BatchWriter(lake, lake.checkpoint(settings.checkpoint_name))
    query = build_query(
        spark,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
        batch_writer=writer,
    )

    def report(progress: StreamProgress) -> None:
        phases = writer.phases.of(progress)
        log.info("batch %d phases (ms): %s", progress.batch_id, json.dumps(phases))
        if on_progress is not None:
            on_progress(dataclasses.replace(progress, phases_ms=phases))

    return drive(query, "the archiver", on_progress=report, should_stop=should_stop)
