"""The archiver: every Kafka record, exactly once, in the master dataset.

A Structured Streaming query from the event topic. Spark's ``kafka`` source reads each
micro-batch and the ingest validator parses it (one Spark job); the parsed rows come to the
driver as Arrow, where valid events are appended to ``master/events`` (partitioned by
``event_date``) and the rest to ``master/rejected`` with the reason and the raw bytes, with
delta-rs. Both writes are idempotent Delta commits keyed by (query id, batch id) (application
transactions, :mod:`lake.append_table`): after a crash Spark replays the unfinished batch with
the same offsets and whatever was already committed is skipped, so every (partition, offset)
lands exactly once. A third commit, idempotent the same way, appends the batch's valid events
counted per minute bucket to ``master/arrivals`` with the master/events version that holds
them: how the serving layer and `ctr batch --stale` learn that a bucket a batch run covered
received events since (:mod:`lake.staleness`).

A batch is at most ``ARCHIVER_MAX_OFFSETS_PER_TRIGGER`` records (default 1,000,000, about
210 MB of Arrow on the driver); the Kafka read and the parse stay spread over the executors.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from events.records import EVENTS_SCHEMA, REJECTED_SCHEMA, parse_records, split
from lake.append_table import AppendTable
from lake.arrivals import arrival_rows, arrivals_table
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from master_dataset.settings import ArchiverSettings
from runtime.formats import read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import PhaseClock, RecentPhases, StreamProgress, drive, query_id

if TYPE_CHECKING:
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
    """foreachBatch function: the parsed batch collected to the driver as Arrow (one Spark job:
    Kafka read and parse), its valid rows appended to master/events, the rest to
    master/rejected, then the valid rows' arrivals, each with delta-rs in one commit idempotent
    under (query id, batch id) (:mod:`lake.append_table`); a table with nothing to add gets no
    commit. ``phases`` keeps, for the last few batches, the milliseconds of each step."""

    def __init__(self, lake: LakeSettings, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.phases = RecentPhases()
        self.events = AppendTable(
            lake.events, EVENTS_SCHEMA, partition_by=MASTER_EVENTS.partition_by
        )
        self.rejected = AppendTable(lake.rejected, REJECTED_SCHEMA)
        self.arrivals = arrivals_table(lake)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        clock = PhaseClock()
        app_id = f"ctr-archiver-{query_id(self.checkpoint)}"
        parsed = batch.toArrow()
        clock.lap("read_parse")
        valid, rejected = split(parsed)
        clock.lap("split")
        if valid.num_rows:
            self.events.append(valid, app_id=app_id, version=batch_id)
        clock.lap("events_write")
        if rejected.num_rows:
            self.rejected.append(rejected, app_id=app_id, version=batch_id)
        clock.lap("rejected_write")
        if valid.num_rows:
            # Read after the events commit (a replay's too): never below the commit's version.
            version = self.events.version()
            assert version is not None
            rows = arrival_rows(
                valid,
                events_version=version,
                batch_id=batch_id,
                archived_at=dt.datetime.now(dt.UTC),
            )
            self.arrivals.append(rows, app_id=app_id, version=batch_id)
        clock.lap("arrivals_write")
        self.phases.record(batch_id, clock.ms)


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
