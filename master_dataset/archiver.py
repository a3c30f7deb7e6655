"""The archiver: every Kafka record, exactly once, in the master dataset.

A Structured Streaming query from the event topic. Each micro-batch is parsed with the ingest
validator; valid events are appended to ``master/events`` (partitioned by ``event_date``) and
the rest to ``master/rejected`` with the reason and the raw bytes. Both writes are idempotent
Delta commits keyed by (query id, batch id): after a crash Spark replays the unfinished batch
with the same offsets and whatever was already committed is skipped, so every (partition,
offset) lands exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from connectors.delta_files import DataFile, write_files
from connectors.delta_sink import DeltaOptions, commit_files
from connectors.formats import read_kafka, write_delta
from infra.kafka_settings import KafkaSettings
from infra.lake import LakeSettings
from infra.spark import PYTHON_DELTA_FORMAT, SparkSettings
from infra.streaming import StreamProgress, drive, query_id
from master_dataset.records import (
    EVENTS_SCHEMA,
    PARSED_SCHEMA,
    REJECTED_SCHEMA,
    parse_batch,
    parse_batches,
    split,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ctr.archiver")


class ArchiverSettings(BaseSettings):
    """The archiver's own knobs (environment variables ``ARCHIVER_*``)."""

    model_config = SettingsConfigDict(env_prefix="ARCHIVER_", extra="ignore")

    trigger_seconds: float = Field(default=10.0, gt=0)
    max_offsets_per_trigger: int = Field(default=1_000_000, ge=1)
    starting_offsets: str = "earliest"
    # Offsets the checkpoint expects but the log no longer holds (retention, a lost broker):
    # stop and say so (true), or skip to the earliest offset still there (false).
    fail_on_data_loss: bool = True
    checkpoint_name: str = "archiver"
    # "tasks": each Spark task parses its records and writes both tables' Parquet files in one
    # pass; the driver commits them (the Python Delta sink only). "dataframe": parse with
    # mapInArrow and write each table through the configured Delta format (JVM delta too).
    write_path: Literal["tasks", "dataframe"] = "tasks"


def build_query(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    spark_settings: SparkSettings,
    settings: ArchiverSettings,
    available_now: bool = False,
) -> StreamingQuery:
    """Start the archiving query (it runs until stopped, or until caught up if available_now)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    checkpoint = lake.checkpoint(settings.checkpoint_name)
    raw = read_kafka(
        spark,
        kafka,
        stream=True,
        spark_settings=spark_settings,
        startingOffsets=settings.starting_offsets,
        maxOffsetsPerTrigger=str(settings.max_offsets_per_trigger),
        failOnDataLoss=str(settings.fail_on_data_loss).lower(),
    )
    if settings.write_path == "tasks":
        if spark_settings.delta_format != PYTHON_DELTA_FORMAT:
            raise ValueError(
                "ARCHIVER_WRITE_PATH=tasks needs SPARK_DELTA_FORMAT=ctr-delta; "
                "use ARCHIVER_WRITE_PATH=dataframe with the JVM delta format"
            )
        sink = _task_writer(lake, checkpoint)
        writer = raw.writeStream.foreachBatch(sink)
    else:
        parsed = raw.mapInArrow(parse_batches, from_arrow_schema(PARSED_SCHEMA))
        writer = parsed.writeStream.foreachBatch(_batch_writer(lake, spark_settings, checkpoint))
    writer = writer.option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return writer.queryName("ctr-archiver").start()


def _batch_writer(
    lake: LakeSettings, spark_settings: SparkSettings, checkpoint: str
) -> Callable[[DataFrame, int], None]:
    events_columns = EVENTS_SCHEMA.names
    rejected_columns = REJECTED_SCHEMA.names

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        app_id = f"ctr-archiver-{query_id(checkpoint)}"
        batch = batch.persist()
        try:
            write_delta(
                batch.where("reason IS NULL").select(*events_columns),
                lake.events,
                spark_settings=spark_settings,
                partition_by=["event_date"],
                txn=(app_id, batch_id),
            )
            write_delta(
                batch.where("reason IS NOT NULL").select(*rejected_columns),
                lake.rejected,
                spark_settings=spark_settings,
                txn=(app_id, batch_id),
            )
        finally:
            batch.unpersist()

    return write_batch


_FILES_SCHEMA = "table string, file string"


def _task_writer(lake: LakeSettings, checkpoint: str) -> Callable[[DataFrame, int], None]:
    """foreachBatch over the raw Kafka rows: tasks parse and write files, the driver commits
    both tables, each idempotently under (query id, batch id)."""
    events_root, rejected_root = lake.events, lake.rejected

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        app_id = f"ctr-archiver-{query_id(checkpoint)}"
        archive = partial(_archive_task, events_root, rejected_root)
        written = batch.mapInArrow(archive, _FILES_SCHEMA).collect()
        files: dict[str, list[DataFile]] = {"events": [], "rejected": []}
        for row in written:
            files[row["table"]].append(DataFile(**json.loads(row["file"])))
        commit_files(
            DeltaOptions(path=events_root, partition_by=("event_date",)),
            EVENTS_SCHEMA,
            files["events"],
            overwrite=False,
            txn=(app_id, batch_id),
        )
        commit_files(
            DeltaOptions(path=rejected_root),
            REJECTED_SCHEMA,
            files["rejected"],
            overwrite=False,
            txn=(app_id, batch_id),
        )

    return write_batch


def _archive_task(
    events_root: str, rejected_root: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    parsed = [parse_batch(b) for b in batches]
    if not parsed:
        return
    events, rejected = split(pa.Table.from_batches(parsed, schema=PARSED_SCHEMA))
    written = [("events", f) for f in write_files(events_root, events, ["event_date"])]
    written += [("rejected", f) for f in write_files(rejected_root, rejected, [])]
    yield pa.RecordBatch.from_pylist(
        [{"table": t, "file": json.dumps(dataclasses.asdict(f))} for t, f in written],
        schema=pa.schema([("table", pa.string()), ("file", pa.string())]),
    )


def run(
    spark: SparkSession,
    *,
    kafka: KafkaSettings | None = None,
    lake: LakeSettings | None = None,
    spark_settings: SparkSettings | None = None,
    settings: ArchiverSettings | None = None,
    available_now: bool = False,
    on_progress: Callable[[StreamProgress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Run the archiver until caught up (available_now) or told to stop; returns rows archived."""
    query = build_query(
        spark,
        kafka=kafka or KafkaSettings(),
        lake=lake or LakeSettings(),
        spark_settings=spark_settings or SparkSettings(),
        settings=settings or ArchiverSettings(),
        available_now=available_now,
    )
    return drive(query, "the archiver", on_progress=on_progress, should_stop=should_stop)
