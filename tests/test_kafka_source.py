"""The Python Kafka source against the real broker and a real SparkSession."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from connectors import read_kafka
from connectors.kafka_source import KafkaRange, KafkaRanges, group_ranges
from infra.kafka_settings import KafkaSettings
from infra.spark import SparkSettings
from infra.topics import create_topics, delete_topics

# Spark's own kafka source schema (KafkaRecordToRowConverter.kafkaSchema).
SPARK_KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)


def _topic(kafka: KafkaSettings, partitions: int = 3) -> KafkaSettings:
    name = f"src-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, {name: partitions})
    return kafka.model_copy(update={"topic": name})


def _produce(kafka: KafkaSettings, records: list[tuple[int, bytes]], linger_ms: int = 5) -> None:
    producer = Producer(kafka.client(**{"linger.ms": linger_ms}))
    for partition, value in records:
        producer.produce(kafka.topic, value=value, key=b"k" + value, partition=partition)
    assert producer.flush(10) == 0


def _stream(
    spark: SparkSession,
    kafka: KafkaSettings,
    settings: SparkSettings,
    checkpoint: Path,
    name: str,
    delta: bool = False,
    **options: str,
) -> list[dict[str, object]]:
    """Run an AvailableNow query into a memory table (or, to survive restarts, the Delta table
    at ``checkpoint/../name``); return the progress of each batch."""
    df = read_kafka(spark, kafka, stream=True, spark_settings=settings, **options)
    writer = df.writeStream.option("checkpointLocation", str(checkpoint))
    if delta:
        writer = writer.format("ctr-delta").option("path", str(checkpoint.parent / name))
    else:
        writer = writer.format("memory").queryName(name)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]
    return [p for p in query.recentProgress if p["numInputRows"]]


def _rows(spark: SparkSession, table: str) -> list[tuple[int, int, bytes]]:
    return sorted(
        (r.partition, r.offset, bytes(r.value))
        for r in spark.table(table).select("partition", "offset", "value").collect()
    )


def test_schema_is_the_spark_kafka_schema(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings
) -> None:
    topic = _topic(kafka)
    batch = read_kafka(spark, topic, stream=False, spark_settings=spark_settings)
    stream = read_kafka(spark, topic, stream=True, spark_settings=spark_settings)
    assert [(f.name, f.dataType) for f in batch.schema] == [
        (f.name, f.dataType) for f in SPARK_KAFKA_SCHEMA
    ]
    assert stream.schema == batch.schema


def test_batch_read_of_an_offset_range(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings
) -> None:
    topic = _topic(kafka, partitions=2)
    _produce(topic, [(0, b"a%d" % n) for n in range(10)] + [(1, b"b%d" % n) for n in range(4)])
    df: DataFrame = read_kafka(
        spark,
        topic,
        stream=False,
        spark_settings=spark_settings,
        startingOffsets=json.dumps({topic.topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({topic.topic: {"0": 7, "1": -1}}),
    )
    rows = df.collect()
    assert sorted((r.partition, r.offset, r.value, r.key) for r in rows) == [
        *[(0, n, b"a%d" % n, b"ka%d" % n) for n in range(2, 7)],
        *[(1, n, b"b%d" % n, b"kb%d" % n) for n in range(4)],
    ]
    assert {(r.topic, r.timestampType) for r in rows} == {(topic.topic, 0)}  # CreateTime


def test_absurd_record_timestamps_are_null_not_a_crash(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings
) -> None:
    """A producer may set any int64 CreateTime; one that overflows microseconds must not stop
    every later read of the partition."""
    topic = _topic(kafka, partitions=1)
    producer = Producer(topic.client())
    stamps = [2**62, 1_700_000_000_000, 300_000_000_000_000, -5_000_000_000_000_000]
    for n, stamp in enumerate(stamps):
        producer.produce(topic.topic, value=b"v%d" % n, partition=0, timestamp=stamp)
    assert producer.flush(10) == 0
    rows = read_kafka(spark, topic, stream=False, spark_settings=spark_settings).collect()
    got = {bytes(r.value): r.timestamp for r in rows}
    assert set(got) == {b"v0", b"v1", b"v2", b"v3"}
    assert got[b"v1"] is not None
    assert int(got[b"v1"].timestamp() * 1000) == 1_700_000_000_000
    assert (got[b"v0"], got[b"v2"], got[b"v3"]) == (None, None, None)


def test_max_input_partitions_groups_ranges_into_fewer_tasks(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings
) -> None:
    topic = _topic(kafka, partitions=3)
    records = [(p, b"%d-%d" % (p, n)) for p in range(3) for n in range(5 + p)]
    _produce(topic, records)
    df = read_kafka(spark, topic, stream=False, spark_settings=spark_settings,
                    maxInputPartitions="2")  # fmt: skip
    assert df.rdd.getNumPartitions() == 2
    assert sorted((r.partition, r.value) for r in df.collect()) == sorted(records)


def test_group_ranges_balances_by_size() -> None:
    ranges = [KafkaRange("t", p, 0, size) for p, size in enumerate([10, 1, 7, 3, 5])]
    groups = group_ranges(ranges, 2)
    grouped = [sorted(r.partition for r in g.ranges) for g in groups if isinstance(g, KafkaRanges)]
    assert grouped == [[0, 3], [1, 2, 4]]  # 10+3 and 7+5+1 offsets
    assert group_ranges(ranges, 9) == ranges  # few enough already: one task per range
    assert group_ranges(ranges, None) == ranges


def test_available_now_reads_the_newest_batch_too(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    # One produce of 5 records: Tansu reports "latest" as 1; the source must still read all 5.
    topic = _topic(kafka, partitions=1)
    _produce(topic, [(0, b"v%d" % n) for n in range(5)], linger_ms=200)
    _stream(spark, topic, spark_settings, tmp_path / "ck", "newest")
    assert _rows(spark, "newest") == [(0, n, b"v%d" % n) for n in range(5)]


def test_max_offsets_per_trigger_caps_every_micro_batch(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    topic = _topic(kafka, partitions=3)
    _produce(topic, [(n % 3, b"%d" % n) for n in range(100)])
    progress = _stream(
        spark, topic, spark_settings, tmp_path / "ck", "capped", maxOffsetsPerTrigger="30"
    )
    sizes = [int(str(p["numInputRows"])) for p in progress]
    assert sum(sizes) == 100
    assert max(sizes) <= 30
    assert len(sizes) >= 4
    assert len(_rows(spark, "capped")) == 100


def test_new_partitions_are_picked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tansu does not implement CreatePartitions, so the broker side is stubbed: partition 1
    # appears between two micro-batches and is read from its earliest offset.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connectors.kafka_source import KafkaOptions, KafkaStreamReader, _KafkaPlanner

    bounds = {("t", 0): (0, 8), ("t", 1): (2, 5)}
    monkeypatch.setattr(_KafkaPlanner, "bounds", lambda self: bounds)
    reader = KafkaStreamReader(
        KafkaOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t"})
    )
    start = {"t": {"0": 5}}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 8, "1": 5}}
    ranges = reader.partitions(start, end)
    assert [r.value for r in ranges] == [
        ("t", 0, 5, 8),
        ("t", 1, 2, 5),
    ]


def test_read_limits_are_shared_by_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from connectors.kafka_source import KafkaOptions, KafkaStreamReader, _KafkaPlanner

    bounds = {("t", 0): (0, 100), ("t", 1): (0, 10), ("t", 2): (0, 0)}
    monkeypatch.setattr(_KafkaPlanner, "bounds", lambda self: bounds)
    options = {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "11"}
    reader = KafkaStreamReader(KafkaOptions.parse(options))
    assert reader.getDefaultReadLimit() == ReadMaxRows(11)
    start = {"t": {"0": 0, "1": 0, "2": 0}}
    assert reader.latestOffset(start, ReadMaxRows(11)) == {"t": {"0": 10, "1": 1, "2": 0}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 100, "1": 10, "2": 0}}
    reader.target = {"t": {"0": 50, "1": 10}}  # AvailableNow: never past the target
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 50, "1": 10, "2": 0}}


def test_lost_offsets_are_an_error_or_a_logged_skip(
    spark: SparkSession, kafka: KafkaSettings, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    topic = _topic(kafka, partitions=1)
    _produce(topic, [(0, b"%d" % n) for n in range(10)])
    _stream(spark, topic, spark_settings, tmp_path / "ck", "loss", delta=True)
    # What a restarted in-memory broker looks like: the topic is back, its offsets start over.
    delete_topics(topic, [topic.topic])
    create_topics(topic, {topic.topic: 1})
    _produce(topic, [(0, b"after-%d" % n) for n in range(3)])
    with pytest.raises(Exception, match="lost records") as caught:
        _stream(spark, topic, spark_settings, tmp_path / "ck", "loss", delta=True)
    assert "failOnDataLoss=false" in str(caught.value)
    _stream(
        spark, topic, spark_settings, tmp_path / "ck", "loss", delta=True, failOnDataLoss="false"
    )
    table = DeltaTable(str(tmp_path / "loss")).to_pyarrow_table().to_pylist()
    assert sorted((r["offset"], r["value"]) for r in table) == sorted(
        [*[(n, b"%d" % n) for n in range(10)], *[(n, b"after-%d" % n) for n in range(3)]]
    )


def test_bad_options_are_named() -> None:
    from connectors.kafka_source import KafkaOptions

    with pytest.raises(ValueError, match=r"'kafka\.bootstrap\.servers' is required"):
        KafkaOptions.parse({"subscribe": "t"})
    with pytest.raises(ValueError, match="'subscribe' must name"):
        KafkaOptions.parse({"kafka.bootstrap.servers": "h:1"})
    with pytest.raises(ValueError, match="'maxOffsetsPerTrigger' must be a positive integer"):
        KafkaOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                            "maxOffsetsPerTrigger": "0"})  # fmt: skip
    with pytest.raises(ValueError, match="'startingOffsets' must be earliest, latest or JSON"):
        KafkaOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                            "startingOffsets": "yesterday"})  # fmt: skip
