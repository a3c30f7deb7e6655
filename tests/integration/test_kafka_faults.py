"""The log's guarantees under faults, on real Apache Kafka brokers: a broker SIGKILLed under the
producer and the archiver, a partition leader SIGKILLed in a 3-broker cluster, and two of three
brokers gone (acks=all with min.insync.replicas=2 refuses, and says so)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import ConfigResource
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from infra.broker import LocalKafka, scratch_cluster
from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from lake.catalog import MASTER_EVENTS
from runtime.kafka_settings import KafkaSettings
from runtime.offsets import topic_offsets
from runtime.topics import admin_client, ensure_topics
from tests.support import faults
from tests.support.consume import coordinates, read_topic
from tests.support.lakes import new_lake
from tests.support.waiting import wait_until

pytestmark = pytest.mark.faults

CTR = str(Path(sys.executable).with_name("ctr"))


def fresh_topic(kafka: KafkaSettings) -> KafkaSettings:
    name = f"faults-{uuid.uuid4().hex[:8]}"
    topic = kafka.model_copy(update={"topic": name, "dlq_topic": f"{name}-dlq"})
    ensure_topics(topic)
    return topic


def partitions(kafka: KafkaSettings) -> dict[int, tuple[int, tuple[int, ...]]]:
    """partition -> (leader, in-sync replicas) of the event topic, once the broker asked knows
    every partition (a broker learns a new topic's partitions a moment after it is created)."""

    def every_partition() -> dict[int, tuple[int, tuple[int, ...]]] | None:
        metadata = admin_client(kafka).list_topics(kafka.topic, timeout=10)
        topic = metadata.topics.get(kafka.topic)
        found = topic.partitions if topic is not None and topic.error is None else {}
        if len(found) != kafka.topic_partitions:
            return None
        return {p: (m.leader, tuple(sorted(m.isrs))) for p, m in found.items()}

    return wait_until(
        every_partition, timeout_s=60, what=f"every partition of {kafka.topic} known", poll_s=0.2
    )


def committed_version(path: str | Path) -> int:
    """The table's latest version, or -1 while it has none a reader can load yet (delta-spark
    may be writing its first commit as we look)."""
    try:
        return DeltaTable(path).version()
    except (TableNotFoundError, DeltaError, OSError):
        return -1


@pytest.mark.timeout(faults.timeout(600))
def test_a_killed_broker_under_produce_and_the_archiver_loses_nothing(tmp_path: Path) -> None:
    with scratch_cluster(tmp_path / "run", topic="sigkilled") as (kafka, broker):
        ensure_topics(kafka)
        lake = new_lake(tmp_path)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=kafka.bootstrap_servers,
            KAFKA_TOPIC=kafka.topic,
            KAFKA_DLQ_TOPIC=kafka.dlq_topic,
            LAKE_ROOT=str(lake.lake_root),
            CHECKPOINT_ROOT=str(lake.checkpoint_root),
            ARCHIVER_TRIGGER_SECONDS="0.5",
            SPARK_SHUFFLE_PARTITIONS="2",
            COLUMNS="200",
        )
        # A first few records, so the archiver's first commit (which may take a while under load)
        # comes before the traffic the broker is killed under.
        warm_up = 200
        first = subprocess.run(
            [CTR, "produce", "--events", str(warm_up), "--seed", "4", "--duplicates", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert first.returncode == 0, first.stdout + first.stderr
        log = (tmp_path / "archiver.log").open("w")
        archiver = subprocess.Popen(
            [CTR, "archive"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        producer: subprocess.Popen[str] | None = None
        events = 4000 * faults.ROUNDS
        try:
            wait_until(
                lambda: committed_version(MASTER_EVENTS.path(lake)) >= 0,
                timeout_s=240,
                what="the archiver committed to master/events",
                poll_s=0.2,
            )
            options = f"--events {events} --rate 400 --seed 3 --duplicates 0 --late 0.02"
            producer = subprocess.Popen(
                [CTR, "produce", *options.split()],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )

            def arrived() -> int:
                return sum(p.records for p in topic_offsets(kafka, kafka.topic))

            for _ in range(faults.ROUNDS):
                # The broker goes down only once the producer is sending (after a restart, once
                # it reaches the broker again): killed before the producer's start-up check
                # reached it (a slow start on a loaded machine), the producer rightly says no
                # broker answered and exits, which is not the fault under test.
                before = arrived()
                wait_until(
                    lambda: arrived() > before,  # noqa: B023
                    timeout_s=120,
                    what="the producer's records reached the topic",
                    poll_s=0.2,
                )
                broker.kill(1)
                time.sleep(3)  # the fault: 3 s with no broker, for the producer and the archiver
                broker.start()
            output, _ = producer.communicate(timeout=300)
        finally:
            if producer is not None:
                producer.kill()
                producer.communicate()
            os.killpg(archiver.pid, signal.SIGTERM)
            archiver.wait(timeout=120)
            log.close()
        assert producer.returncode == 0, output
        delivered = re.search(r"delivered ([\d,]+) to the event topic.*?([\d,]+) failed", output)
        assert delivered is not None, output
        assert (int(delivered.group(1).replace(",", "")), delivered.group(2)) == (events, "0")
        events += warm_up

        # Whatever the streaming archiver did not get to, a catch-up run archives.
        faults.catch_up("archive", env)
        records = read_topic(kafka, kafka.topic)
        assert len(records) == events
        table = DeltaTable(MASTER_EVENTS.path(lake)).to_pyarrow_table()
        archived = coordinates(table)
        assert len(archived) == len(set(archived)) == events, "by partition and offset"
        assert set(archived) == {(r.partition, r.offset) for r in records}
        ids = table.column("event_id").to_pylist()
        assert len(set(ids)) == len(ids) == events, "by event id"


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with scratch_cluster(tmp_path_factory.mktemp("kafka3"), brokers=3) as (_, cluster):
        yield cluster


@pytest.fixture
def healthy3(cluster3: LocalKafka) -> LocalKafka:
    """The 3-broker cluster with every broker running (a test before may have killed some)."""
    cluster3.start()
    return cluster3


def test_topics_get_three_replicas_and_two_in_sync(healthy3: LocalKafka) -> None:
    topic = fresh_topic(healthy3.kafka)
    for leader, isr in partitions(topic).values():
        assert leader in (1, 2, 3)
        assert isr == (1, 2, 3)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic.topic)
    admin = admin_client(topic)  # must outlive its futures
    [described] = admin.describe_configs([resource]).values()
    assert described.result()["min.insync.replicas"].value == "2"


class Acks:
    """Which records the brokers acknowledged, and which they refused, per delivery report."""

    def __init__(self) -> None:
        self.acked: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        value = message.value() or b""
        if error is None:
            self.acked.append(value)
        else:
            self.failed.append((value, error.str()))


def acks_all_producer(kafka: KafkaSettings, acks: Acks, timeout_ms: int = 120_000) -> Producer:
    """The platform's producer configuration (acks=all, idempotence) with a report per record."""
    overrides = ProducerSettings(delivery_timeout_ms=timeout_ms).client_overrides()
    overrides.update({"delivery.report.only.error": False, "linger.ms": 5})
    return Producer(kafka.client(on_delivery=acks, **overrides))


@pytest.mark.timeout(faults.timeout(240))
def test_a_killed_leader_loses_no_acknowledged_record(healthy3: LocalKafka) -> None:
    for round_ in range(faults.ROUNDS):
        topic = fresh_topic(healthy3.kafka)
        acks = Acks()
        producer = acks_all_producer(topic, acks)
        sent = 0
        victim: int | None = partitions(topic)[0][0]
        started = time.monotonic()
        while time.monotonic() - started < 8:
            for _ in range(200):
                producer.produce(topic.topic, value=b"r%d-%d" % (round_, sent), key=b"%d" % sent)
                sent += 1
            producer.poll(0.05)
            if victim is not None and time.monotonic() - started > 2:
                healthy3.kill(victim)  # the leader of partition 0, and of others
                victim = None
        assert producer.flush(150) == 0, f"{len(acks.acked)} of {sent} acknowledged"
        assert acks.failed == [], acks.failed[:5]
        assert len(acks.acked) == sent
        values = Counter(r.value for r in read_topic(topic, topic.topic))
        assert sorted(values) == sorted(acks.acked), "an acknowledged record is missing"
        assert max(values.values()) == 1, "a record was written twice"
        assert all(leader in (1, 2, 3) for leader, _ in partitions(topic).values()), partitions(
            topic
        )
        healthy3.start()


@pytest.mark.timeout(faults.timeout(240))
def test_acks_all_is_refused_without_two_in_sync_replicas(healthy3: LocalKafka) -> None:
    for _ in range(faults.ROUNDS):
        topic = fresh_topic(healthy3.kafka)
        healthy3.kill(2)
        healthy3.kill(3)
        # The controller fences them after broker.session.timeout.ms; the ISRs shrink to one.
        wait_until(
            lambda: all(isr == (1,) for _, isr in partitions(topic).values()),  # noqa: B023
            timeout_s=60,
            what="the in-sync replicas shrank to broker 1",
            poll_s=0.2,
        )
        quick = ProducerSettings(delivery_timeout_ms=5000, delivery_reports="all")
        with EventProducer(topic, quick, validate_records=False) as producer:
            producer.send_many([(b"refused-%d" % n, b"%d" % n) for n in range(50)])
            producer.flush(30)
        assert (producer.stats.delivered, producer.stats.failed) == (0, 50)
        assert any("in-sync replicas" in e or "timed out" in e for e in producer.stats.errors), (
            producer.stats.errors
        )
        assert read_topic(topic, topic.topic) == []

        healthy3.start(nodes=[2])  # one broker back: two in sync again
        wait_until(
            lambda: all(len(isr) >= 2 for _, isr in partitions(topic).values()),  # noqa: B023
            timeout_s=60,
            what="broker 2 rejoined the in-sync replicas",
            poll_s=0.2,
        )
        with EventProducer(topic, quick, validate_records=False) as producer:
            producer.send_many([(b"accepted-%d" % n, b"%d" % n) for n in range(50)])
            producer.flush(30)
        assert (producer.stats.delivered, producer.stats.failed) == (50, 0)
        assert sorted(r.value for r in read_topic(topic, topic.topic)) == sorted(
            b"accepted-%d" % n for n in range(50)
        )
        healthy3.start()
