"""The archiver: every Kafka record, exactly once, in the master dataset.

A Structured Streaming query from the event topic. Each micro-batch is parsed with the ingest
validator; valid events are appended to ``master/events`` (partitioned by ``event_date``) and
the rest to ``master/rejected`` with the reason and the raw bytes. Spark's ``kafka`` source
reads, delta-spark writes; both writes are idempotent Delta commits keyed by (query id, batch
id) (``txnAppId``/``txnVersion``): after a crash Spark replays the unfinished batch with the same
offsets and whatever was already committed is skipped, so every (partition, offset) lands
exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from events.records import EVENTS_SCHEMA, REJECTED_SCHEMA, parse_records
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from master_dataset.settings import ArchiverSettings
from runtime.formats import read_kafka, write_delta
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import StreamProgress, drive, query_id

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
    writer = parsed.writeStream.foreachBatch(batch_writer(lake, checkpoint))
    writer = writer.option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return writer.queryName("ctr-archiver").start()


def batch_writer(lake: LakeSettings, checkpoint: str) -> Callable[[DataFrame, int], None]:
    """foreachBatch function: the parsed batch's valid rows to master/events, the rest to
    master/rejected, each commit idempotent under (query id, batch id)."""
    events_columns = EVENTS_SCHEMA.names
    rejected_columns = REJECTED_SCHEMA.names

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        app_id = f"ctr-archiver-{query_id(checkpoint)}"
        batch = batch.persist()
        try:
            write_delta(
                batch.where("reason IS NULL").select(*events_columns),
                lake.events,
                partition_by=MASTER_EVENTS.partition_by,
                txn=(app_id, batch_id),
            )
            write_delta(
                batch.where("reason IS NOT NULL").select(*rejected_columns),
                lake.rejected,
                txn=(app_id, batch_id),
            )
        finally:
            batch.unpersist()

    return write_batch


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
    """Run the archiver until caught up (available_now) or told to stop; returns rows archived."""
    query = build_query(
        spark,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
    )
    return drive(query, "the archiver", on_progress=on_progress, should_stop=should_stop)
