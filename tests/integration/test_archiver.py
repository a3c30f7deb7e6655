"""The archiver: every Kafka record exactly once in master/events or master/rejected, through
restarts and SIGKILLs, against the real broker, Spark and Delta tables."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from ingest.producer import EventProducer
from ingest.send_loop import ProduceSummary, produce
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.catalog import MASTER_EVENTS, MASTER_REJECTED
from lake.settings import LakeSettings
from master_dataset.archiver import run
from master_dataset.settings import ArchiverSettings
from runtime.kafka_settings import KafkaSettings
from runtime.stream_metrics import StreamMetrics
from tests.support import faults
from tests.support.consume import coordinates, read_topic
from views.columns import DIMENSIONS
from views.ctr import ctr


def _produce_mixed(topics: KafkaSettings, n: int, seed: int) -> ProduceSummary:
    config = TrafficConfig(
        seed=seed,
        start_ms=int(time.time() * 1000) - n,
        duplicate_fraction=0.02,
        malformed_fraction=0.05,
    )
    with EventProducer(
        topics, ProducerSettings(), validate_records=False
    ) as producer:  # malformed reach the topic
        return produce(TrafficGenerator(config), producer, limit=n)


def _archived(lake: LakeSettings) -> tuple[pa.Table, pa.Table]:
    return (
        DeltaTable(MASTER_EVENTS.path(lake)).to_pyarrow_table(),
        DeltaTable(MASTER_REJECTED.path(lake)).to_pyarrow_table(),
    )


def _by_key(
    rows: pa.Table, key: list[str], *measures: str
) -> dict[tuple[object, ...], tuple[int, ...]]:
    return {tuple(r[k] for k in key): tuple(r[m] for m in measures) for r in rows.to_pylist()}


def _assert_exactly_once(topics: KafkaSettings, lake: LakeSettings) -> tuple[int, int]:
    records = {(r.partition, r.offset): r for r in read_topic(topics, topics.topic)}
    events, rejected = _archived(lake)
    archived = coordinates(events) + coordinates(rejected)
    assert len(archived) == len(set(archived)), "a record was archived twice"
    assert set(archived) == set(records), "a record is missing"
    for row in rejected.to_pylist():
        original = records[(row["kafka_partition"], row["kafka_offset"])]
        assert row["value"] == original.value  # raw bytes kept
        assert row["reason"]
    return events.num_rows, rejected.num_rows


def test_available_now_archives_every_record_once(
    spark: SparkSession,
    topics: KafkaSettings,
    lake: LakeSettings,
) -> None:
    summary = _produce_mixed(topics, 3000, seed=21)
    settings = ArchiverSettings(max_offsets_per_trigger=1000)
    registry = CollectorRegistry()
    metrics = StreamMetrics(registry, "archiver", topics)
    archived = run(
        spark,
        kafka=topics,
        lake=lake,
        settings=settings,
        available_now=True,
        on_progress=metrics.record,
    )
    assert archived == 3000
    events, rejected = _assert_exactly_once(topics, lake)
    assert (events, rejected) == (summary.events + summary.duplicates, summary.malformed)

    table = DeltaTable(MASTER_EVENTS.path(lake))
    assert table.metadata().partition_columns == ["event_date"]
    rows = table.to_pyarrow_table().to_pylist()
    assert all(r["event_date"] == r["event_time"].date() for r in rows)
    assert all(r["ingest_time"].tzinfo is not None for r in rows)
    reasons = DeltaTable(MASTER_REJECTED.path(lake)).to_pyarrow_table().column("reason").to_pylist()
    assert any(r.startswith("record: not valid JSON") for r in reasons)

    # master/arrivals: each batch's view rows, counted on the driver, add up to Spark's view
    # (views.ctr) of everything archived, duplicates included, key by key.
    arrivals = DeltaTable(lake.table("master/arrivals")).to_pyarrow_table()
    assert len(set(arrivals.column("batch_id").to_pylist())) >= 3  # 1,000 records a batch
    key = ["bucket_start", *DIMENSIONS]
    summed = arrivals.group_by(key).aggregate([("impressions", "sum"), ("clicks", "sum")])
    expected = spark.read.format("delta").load(MASTER_EVENTS.path(lake)).transform(ctr).toArrow()
    assert _by_key(summed, key, "impressions_sum", "clicks_sum") == _by_key(
        expected, key, "impressions", "clicks"
    )
    assert sum(r["impressions"] for r in expected.to_pylist()) > 0

    # Nothing new: a second run archives nothing and commits nothing.
    version = table.version()
    assert run(spark, kafka=topics, lake=lake, settings=settings, available_now=True) == 0
    assert DeltaTable(MASTER_EVENTS.path(lake)).version() == version

    # Its metrics: what it read and rejected, its batches and their phases, and its lag per
    # partition asked of the broker at each scrape (none: caught up; then the records sent since).
    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"query": "archiver", **labels})

    def lag() -> dict[str, float]:
        return {s.labels["partition"]: s.value for family in registry.collect()
                if family.name == "ctr_stream_lag_records" for s in family.samples}  # fmt: skip

    assert sample("ctr_stream_records_total") == 3000
    assert sample("ctr_stream_invalid_records_total") == summary.malformed
    batches = sample("ctr_stream_batches_total") or 0
    assert batches >= 3
    assert sample("ctr_stream_batch_duration_seconds_count") == batches
    assert (sample("ctr_stream_phase_seconds_total", phase="events_commit") or 0) > 0
    assert (sample("ctr_stream_last_batch_timestamp_seconds") or 0) > time.time() - 600
    assert lag() == dict.fromkeys(map(str, range(6)), 0.0)  # the topic's 6 partitions
    _produce_mixed(topics, 40, seed=22)
    assert sum(lag().values()) == 40
    metrics.close()


@pytest.mark.faults
@pytest.mark.timeout(faults.timeout(600))
def test_sigkill_and_restart_never_loses_or_repeats_a_record(
    kafka_env: dict[str, str], topics: KafkaSettings, lake: LakeSettings
) -> None:
    env = faults.job_env(
        kafka_env, lake, ARCHIVER_TRIGGER_SECONDS="0.5", ARCHIVER_MAX_OFFSETS_PER_TRIGGER="1500"
    )
    with faults.traffic(topics, seed=5, malformed_fraction=0.03):
        # Spark starts in ~8 s: kill before, during and after it starts.
        faults.sigkill_repeatedly("archive", env, kills=3 * faults.ROUNDS, seed=1, alive_s=(9, 20))
    faults.catch_up("archive", {**env, "ARCHIVER_MAX_OFFSETS_PER_TRIGGER": "100000"})
    events, rejected = _assert_exactly_once(topics, lake)
    assert events > 1000
    assert rejected > 0
