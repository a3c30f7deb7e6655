"""`ctr archive`: keep the master dataset (every Kafka record, exactly once, in Delta)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.console import (
    StreamDisplay,
    check_kafka_login,
    console,
    log_lines_unless_a_terminal,
    run_streaming_job,
)
from lake.catalog import MASTER_EVENTS, MASTER_REJECTED
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from runtime.spark_settings import SparkSettings
from runtime.streaming import StreamProgress


def archive(
    available_now: Annotated[
        bool,
        typer.Option(
            "--available-now",
            help="Archive what the topic holds now, then exit (AvailableNow trigger).",
        ),
    ] = False,
) -> None:
    """Stream the event topic into master/events and master/rejected, exactly once.

    Valid events go to master/events (partitioned by event_date) with their Kafka partition,
    offset and ingest time; invalid records go to master/rejected with the reason and the raw
    bytes. Progress is checkpointed under CHECKPOINT_ROOT: restart it any time.
    """
    from lake.registry import start_new_lake
    from master_dataset.archiver import run
    from master_dataset.settings import ArchiverSettings

    kafka, lake, spark_settings = KafkaSettings(), LakeSettings(), SparkSettings()
    settings = ArchiverSettings()
    for first in start_new_lake(lake):
        console.print(f"a new lake: {first.view} version {first.version} published")
    events, rejected = MASTER_EVENTS.path(lake), MASTER_REJECTED.path(lake)
    console.print(
        f"archiving {kafka.topic} from {kafka.bootstrap_servers} into {events} and {rejected} "
        f"(checkpoint {lake.checkpoint(settings.checkpoint_name)})"
    )
    check_kafka_login(kafka)
    from runtime.metrics import MetricsSettings
    from runtime.spark import spark_session
    from runtime.stream_metrics import served

    log_lines_unless_a_terminal()
    metrics = served("archiver", settings.metrics_port, MetricsSettings().host, kafka)
    spark = spark_session(spark_settings, lake.object_store)

    def rate(progress: StreamProgress) -> str:
        return f"{progress.processed_rows_per_second:,.0f} rows/s"

    total = run_streaming_job(
        run,
        spark,
        StreamDisplay("archiving", rate),
        metrics,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
    )
    console.print(f"archived {total:,} records" + (" (caught up)" if available_now else ""))
