"""Spark's kafka source, delta-spark's reader and Spark's results committed by delta-rs as the
platform uses them, against the real broker and real Delta tables: read limits, AvailableNow,
broker-stamped timestamps, replaced intervals, idempotent commits and replayed micro-batches,
and tables every reader can read."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession

from lake.append_table import Maintained
from lake.catalog import MASTER_EVENTS, MASTER_REJECTED
from lake.duckdb_delta import delta_duckdb
from lake.frames import commit_frame
from lake.settings import LakeSettings
from master_dataset.archiver import ArchiveBatchWriter
from master_dataset.archiver import run as run_archiver
from master_dataset.settings import ArchiverSettings
from runtime.connectors import ARCHIVER_GROUP, read_delta, read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.object_store import ObjectStoreSettings
from runtime.streaming import Periodic, StreamProgress
from runtime.topics import ensure_topics
from serving_layer.snapshots import SnapshotSource
from speed_layer.job import SpeedBatchWriter
from speed_layer.settings import SpeedSettings
from tests.support.events import wire_event

ROWS = [
    (1, "a", dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)),
    (2, "b", dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, 11, 0, tzinfo=dt.UTC)),
    (3, "c", dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 9, 0, tzinfo=dt.UTC)),
    (4, None, dt.date(2026, 1, 2), None),
]
SCHEMA = "id long, name string, day date, at timestamp"
ARROW_SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("day", pa.date32()),
     ("at", pa.timestamp("us", tz="UTC"))]
)  # fmt: skip


def write(rows: DataFrame, path: Path, **options: object) -> bool:
    local = ObjectStoreSettings()  # a local path: the store is never asked
    return commit_frame(rows, str(path), local, ARROW_SCHEMA, **options)  # type: ignore[arg-type]


# Reader features delta-rs and DuckDB's delta extension cannot serve from a plain file list.
UNREADABLE = {"deletionVectors", "columnMapping", "v2Checkpoint", "rowTracking"}


def frame(spark: SparkSession, rows: Sequence[tuple[object, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA).repartition(2)


def ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def fresh_topic(kafka: KafkaSettings, partitions: int = 1) -> KafkaSettings:
    name = f"connectors-{uuid.uuid4().hex[:8]}"
    topic = kafka.model_copy(
        update={"topic": name, "dlq_topic": f"{name}-dlq", "topic_partitions": partitions}
    )
    ensure_topics(topic)
    return topic


def produce(topic: KafkaSettings, values: Sequence[bytes], **extra: object) -> None:
    producer = Producer(topic.client())
    for value in values:
        producer.produce(topic.topic, value=value, **extra)  # type: ignore[arg-type]
    assert producer.flush(30) == 0


# -- the lake's tables, read by every reader ------------------------------------------------


def test_tables_keep_to_features_every_reader_reads(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    write(frame(spark, ROWS), path, properties={"delta.checkpointInterval": "10"})
    for n in range(11):  # past the 10-commit checkpoint interval: a checkpoint is written
        write(frame(spark, [(100 + n, "x", dt.date(2026, 1, 3), None)]), path)
    table = DeltaTable(str(path))
    protocol = table.protocol()
    features = set(protocol.reader_features or ()) | set(protocol.writer_features or ())
    assert not features & UNREADABLE
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert list((path / "_delta_log").glob("*.checkpoint.parquet"))
    first_commit = (path / "_delta_log" / "00000000000000000000.json").read_text()
    assert '"engineInfo":"delta-rs' in first_commit  # every commit to the lake: lake.frames
    expected = [1, 2, 3, 4, *range(100, 111)]
    assert ids(path) == expected  # delta-rs
    query = f"SELECT id, \"at\" FROM delta_scan('{path}') ORDER BY id"
    duck = delta_duckdb().execute(query).fetchall()
    assert [r[0] for r in duck] == expected
    assert duck[0][1] == ROWS[0][3]  # microseconds, UTC: not INT96
    assert sorted(r.id for r in read_delta(spark, str(path)).collect()) == expected


def test_the_platforms_tables_are_readable_by_the_serving_layer(
    spark: SparkSession, kafka: KafkaSettings, lake: LakeSettings
) -> None:
    topic = fresh_topic(kafka)
    event = (
        b'{"event_id": "e1", "event_type": "impression", "event_time": %d, '
        b'"impression_id": "i1", "ad_id": "a", "campaign_id": "c", "site_id": "s", '
        b'"country": "US", "device_type": "mobile", "user_id": "u", "schema_version": 1}'
        % int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    )
    produce(topic, [event, b"not json"])
    archived = run_archiver(
        spark, kafka=topic, lake=lake, settings=ArchiverSettings(), available_now=True
    )
    assert archived == 2
    snapshot = SnapshotSource(lake, refresh_s=0).current()
    for name in ("master/events", "master/rejected"):
        table = snapshot[name]
        assert table.version is not None
        assert table.files
        assert table.schema == DeltaTable(lake.table(name)).schema().to_arrow()
    events = DeltaTable(MASTER_EVENTS.path(lake)).to_pyarrow_table()
    assert events.column("event_id").to_pylist() == ["e1"]
    assert events.schema.field("event_time").type == pa.timestamp("us", tz="UTC")
    log = (Path(MASTER_EVENTS.path(lake)) / "_delta_log" / "00000000000000000000.json").read_text()
    assert '"engineInfo":"delta-rs' in log  # the archiver appends with delta-rs
    assert (
        spark.read.format("delta").load(MASTER_EVENTS.path(lake)).count() == 1
    )  # the batch job's reader


# -- writes: replaceWhere, idempotent commits ------------------------------------------------


def test_replace_where_replaces_only_matching_rows(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    write(frame(spark, ROWS), path)
    new = frame(spark, [(10, "x", dt.date(2026, 1, 2), None)])
    write(new, path, predicate="day = '2026-01-02'")
    assert ids(path) == [1, 2, 10]


def test_replace_where_refuses_rows_outside_the_predicate(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    write(frame(spark, ROWS), path)
    stray = frame(spark, [(10, "x", dt.date(2026, 1, 5), None)])
    with pytest.raises(DeltaError, match="failed validation"):
        write(stray, path, predicate="day = '2026-01-02'")
    assert ids(path) == [1, 2, 3, 4]  # nothing changed
    assert DeltaTable(str(path)).version() == 0


def test_idempotent_writes_by_application_and_version(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    assert write(frame(spark, ROWS[:1]), path, txn=("app", 0))
    assert not write(frame(spark, ROWS[:1]), path, txn=("app", 0))  # replay: no-op
    assert write(frame(spark, ROWS[1:2]), path, txn=("app", 1))
    assert write(frame(spark, ROWS[2:3]), path, txn=("other", 0))
    assert ids(path) == [1, 2, 3]
    assert DeltaTable(str(path)).transaction_version("app") == 1


def test_a_replayed_archiver_batch_is_a_no_op(
    spark: SparkSession, kafka: KafkaSettings, lake: LakeSettings
) -> None:
    topic = fresh_topic(kafka)
    produce(topic, [b"{", b"[]"])
    checkpoint = Path(lake.checkpoint("replay"))
    (checkpoint).mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"replayed-query"}')
    records = read_kafka(spark, topic, stream=False, group_prefix=ARCHIVER_GROUP)
    write = ArchiveBatchWriter(lake, str(checkpoint), ArchiverSettings())
    write(records, 7)
    write(records, 7)  # Spark replays a batch after a crash: same id, same records
    rejected = DeltaTable(MASTER_REJECTED.path(lake))
    assert rejected.to_pyarrow_table().num_rows == 2
    assert rejected.transaction_version("ctr-archiver-replayed-query") == 7
    write(records, 8)  # the next batch does write
    assert DeltaTable(MASTER_REJECTED.path(lake)).to_pyarrow_table().num_rows == 4


def test_the_archiver_compacts_its_tables_between_batches(
    spark: SparkSession, kafka: KafkaSettings, lake: LakeSettings
) -> None:
    """Every ARCHIVER_MAINTENANCE_SECONDS the archiver packs its tables' files (a file per
    batch) and the rows and its exactly-once bookkeeping stay."""
    topic = fresh_topic(kafka)
    produce(topic, [b"{", b"[]"])
    checkpoint = Path(lake.checkpoint("maintained"))
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"maintained-query"}')
    records = read_kafka(spark, topic, stream=False, group_prefix=ARCHIVER_GROUP)
    write = ArchiveBatchWriter(lake, str(checkpoint), ArchiverSettings(maintenance_seconds=3600))
    write.maintenance_due = Periodic(3600)  # not a minute after the start either
    for batch_id in range(3):
        write(records, batch_id)
    assert len(DeltaTable(MASTER_REJECTED.path(lake)).file_uris()) == 3
    write.maintenance_due = Periodic(0.001)
    write(records, 3)  # the 4th file, then the pass (in its own thread) packs them
    assert write.join_maintenance(timeout=120)
    rejected = DeltaTable(MASTER_REJECTED.path(lake))
    assert len(rejected.file_uris()) == 1
    assert rejected.to_pyarrow_table().num_rows == 8
    assert rejected.transaction_version("ctr-archiver-maintained-query") == 3


def test_the_archivers_maintenance_never_holds_a_batch_back(
    spark: SparkSession, kafka: KafkaSettings, lake: LakeSettings
) -> None:
    """A maintenance pass runs beside the commits: batches commit while it is under way, a
    pass due while one runs is skipped, and the first pass vacuums in full, the next lite."""
    topic = fresh_topic(kafka)
    produce(topic, [b"{"])
    checkpoint = Path(lake.checkpoint("maintained-aside"))
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"aside-query"}')
    records = read_kafka(spark, topic, stream=False, group_prefix=ARCHIVER_GROUP)
    write = ArchiveBatchWriter(lake, str(checkpoint), ArchiverSettings(maintenance_seconds=3600))
    started, release = threading.Event(), threading.Event()
    passes: list[bool] = []

    class Held:
        path = "held"

        def maintain(self, *, full_vacuum: bool = True) -> Maintained:
            passes.append(full_vacuum)
            started.set()
            assert release.wait(timeout=120)
            return Maintained(self.path, 0, 0, 0, full_vacuum)

    write.maintained = [Held()]
    write.maintenance_due = Periodic(0.001)
    write(records, 0)  # starts a pass, which holds
    assert started.wait(timeout=120)
    write(records, 1)  # commits while the pass holds; the pass due now is skipped
    write(records, 2)
    assert (
        DeltaTable(MASTER_REJECTED.path(lake)).transaction_version("ctr-archiver-aside-query") == 2
    )
    assert passes == [True]
    release.set()
    assert write.join_maintenance(timeout=120)
    write(records, 3)
    assert write.join_maintenance(timeout=120)
    assert passes == [True, False]  # full at the first pass after a start, then lite


def test_a_replayed_speed_batch_is_appended_once(spark: SparkSession, lake: LakeSettings) -> None:
    """The speed job's append carries (query id, batch id): a replay writes nothing."""
    checkpoint = Path(lake.checkpoint("speed-replay"))
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"speed-query"}')
    at = dt.datetime(2026, 11, 22, 10, 0, 30, tzinfo=dt.UTC)
    stamp = int(at.timestamp() * 1000) + 60_000
    for batch_id in (0, 1):
        (checkpoint / "offsets" / str(batch_id)).write_text(
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{stamp}}}\n{{}}\n'
        )

    def record(offset: int, kind: str) -> tuple[object, ...]:
        value = {**wire_event(f"e{offset}", kind, at), "impression_id": "i-1"}
        return (b"i-1", orjson.dumps(value), "events", 0, offset, at)

    events = spark.createDataFrame(  # the Kafka source's columns
        [record(0, "impression"), record(1, "click")],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    write = SpeedBatchWriter(lake, str(checkpoint), SpeedSettings())
    write(events, 0)
    write(events, 0)  # replayed
    write(events, 1)  # the next batch adds
    table = DeltaTable(lake.table("speed/ctr"))
    rows = table.to_pyarrow_table().to_pylist()
    # Two batches' counts (each task writes its partial counts: readers sum them).
    assert sum(r["impressions"] for r in rows) == sum(r["clicks"] for r in rows) == 2
    assert table.transaction_version("ctr-speed-speed-query") == 1
    assert table.version() == 2  # created, then a commit per batch: the replay made none


def test_the_speed_jobs_maintenance_never_holds_a_batch_back(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """The roll-ups and maintenance run in a thread of their own: micro-batches commit while a
    pass is under way, a pass due meanwhile waits for the next batch after it, and a real pass
    beside the commits loses no count."""
    checkpoint = Path(lake.checkpoint("speed-aside"))
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"aside-query"}')
    at = dt.datetime(2026, 11, 22, 10, 0, 30, tzinfo=dt.UTC)
    stamp = int(at.timestamp() * 1000) + 60_000
    for batch_id in range(6):
        (checkpoint / "offsets" / str(batch_id)).write_text(
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{stamp}}}\n{{}}\n'
        )
    events = spark.createDataFrame(  # the Kafka source's columns
        [(b"k", orjson.dumps(wire_event("e0", "impression", at)), "events", 0, 0, at)],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    write = SpeedBatchWriter(lake, str(checkpoint), SpeedSettings())
    started, release = threading.Event(), threading.Event()
    passes: list[int] = []
    real_pass = write.maintain

    def held(watermark_ms: int, *, roll_up: bool = True, maintenance: bool = True) -> None:
        passes.append(watermark_ms)
        started.set()
        assert release.wait(timeout=120)

    write.maintain = held  # type: ignore[method-assign]
    write.maintenance_due = Periodic(0.001)
    write(events, 0)  # commits, then starts a pass, which holds
    assert started.wait(timeout=120)
    write(events, 1)  # commit while the pass holds; the passes due now wait
    write(events, 2)
    table = DeltaTable(lake.table("speed/ctr"))
    assert table.transaction_version("ctr-speed-aside-query") == 2
    assert len(passes) == 1
    release.set()
    assert write.join_maintenance(timeout=120)
    write(events, 3)  # the next pass starts after the batch
    assert write.join_maintenance(timeout=120)
    assert len(passes) == 2
    # A real pass (compaction of the minute's micro-batch files is the roll-up's; here the
    # maintenance: pruning, VACUUM, speed/late) beside two more batches' commits.
    write.maintain = real_pass  # type: ignore[method-assign]
    write(events, 4)
    write(events, 5)
    assert write.join_maintenance(timeout=120)
    rows = DeltaTable(lake.table("speed/ctr")).to_pyarrow_table()
    assert sum(rows.column("impressions").to_pylist()) == 6
    assert write.last_pass.keys() >= {"maintenance"}


# -- Spark's kafka source ----------------------------------------------------------------------


def test_every_micro_batch_keeps_to_the_read_limit(
    spark: SparkSession, kafka: KafkaSettings, lake: LakeSettings
) -> None:
    topic = fresh_topic(kafka, partitions=3)
    produce(topic, [b"{%d" % n for n in range(250)])
    batches: list[StreamProgress] = []
    settings = ArchiverSettings(max_offsets_per_trigger=100)
    archived = run_archiver(
        spark,
        kafka=topic,
        lake=lake,
        settings=settings,
        available_now=True,
        on_progress=batches.append,
    )
    assert archived == 250  # AvailableNow: everything there when it started, then it stops
    sizes = [b.input_rows for b in batches if b.input_rows]
    assert sum(sizes) == 250
    assert max(sizes) <= 100
    assert len(sizes) >= 3


def test_producer_timestamps_are_replaced_by_the_brokers(
    spark: SparkSession, kafka: KafkaSettings
) -> None:
    """Topics are LogAppendTime: an int64 CreateTime Spark cannot convert to a timestamp
    (2^62 ms) never reaches the source."""
    topic = fresh_topic(kafka)
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    produce(topic, [b"a", b"b"], timestamp=2**62)
    rows = read_kafka(spark, topic, stream=False, group_prefix=ARCHIVER_GROUP).collect()
    assert sorted(bytes(r.value) for r in rows) == [b"a", b"b"]
    for row in rows:
        stamp = row.timestamp.replace(tzinfo=dt.UTC)  # the session is UTC
        assert before <= stamp <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
        assert row.timestampType == 1  # LogAppendTime
