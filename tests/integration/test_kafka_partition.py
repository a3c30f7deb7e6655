"""A broker cut off, not killed: three real Apache Kafka brokers, each in its own network
namespace (infra/netns.py), the leader of a partition cut off from the controller, the other
brokers and the clients while records are produced with acks=all, then healed. Every
acknowledged record is in the log once, the cut-off broker catches up (back in every ISR), and
the archiver reads them all into master/events exactly once.

Needs root and iproute2 (namespaces, veth, a bridge); skipped without them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from infra.broker import LocalKafka
from infra.broker_settings import BrokerSettings
from infra.netns import BrokerNetwork
from lake.catalog import MASTER_REJECTED
from master_dataset.archiver import run as run_archiver
from master_dataset.settings import ArchiverSettings
from runtime.kafka_settings import KafkaSettings
from tests.integration.test_kafka_faults import (
    Acks,
    acks_all_producer,
    fresh_topic,
    partitions,
)
from tests.support import faults
from tests.support.consume import read_topic
from tests.support.lakes import new_lake
from tests.support.waiting import wait_until

CTR = str(Path(sys.executable).with_name("ctr"))

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None,
        reason="network namespaces need root and iproute2",
    ),
]


@pytest.fixture(scope="module")
def isolated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalKafka, BrokerNetwork]]:
    network = BrokerNetwork(prefix=f"ct{os.getpid() % 100_000}", net=200 + os.getpid() % 50)
    network.destroy()  # what a crashed run left
    kafka = KafkaSettings(bootstrap_servers=f"{network.host(1)}:9092")
    settings = BrokerSettings(run_dir=tmp_path_factory.mktemp("kafka-netns"))
    cluster = LocalKafka(kafka, settings, network=network)
    state = cluster.start()
    cluster.kafka = kafka.model_copy(update={"bootstrap_servers": state.bootstrap_servers})
    try:
        yield cluster, network
    finally:
        cluster.stop(timeout_s=15, delete_data=True)
        network.destroy()


def test_the_brokers_listen_in_their_own_namespaces(
    isolated: tuple[LocalKafka, BrokerNetwork],
) -> None:
    cluster, network = isolated
    layout = cluster.layout()
    assert [n.netns for n in layout.brokers] == [network.namespace(i) for i in (1, 2, 3)]
    assert layout.controller.host == network.gateway
    for node in layout.brokers:
        pid = cluster.state().pids[node.node_id]
        assert pid is not None
        # the JVM's network namespace is its broker's, not the machine's
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        assert inode == os.stat(f"/run/netns/{node.netns}").st_ino
        assert inode != os.stat("/proc/self/ns/net").st_ino


Layout = dict[int, tuple[int, tuple[int, ...]]]  # partition -> (leader, in-sync replicas)


def _produce_across_a_cut(
    producer: Producer, topic: KafkaSettings, network: BrokerNetwork, victim: int
) -> tuple[int, Layout]:
    """Records all along: 3 s, then ``victim`` cut off until the controller has fenced it
    (broker.session.timeout.ms 4 s; 120 s at most, however slow the machine), 5 s more cut off,
    then 12 s healed. Returns the records sent and the partitions as seen once it was fenced
    (empty if it never was)."""
    sent = 0
    cut_at: float | None = None
    looked_at = 0.0
    during: Layout = {}
    fenced_at: float | None = None
    healed_at: float | None = None
    started = time.monotonic()
    while healed_at is None or time.monotonic() - healed_at < 12:
        for _ in range(100):
            producer.produce(topic.topic, value=b"p-%d" % sent, key=b"%d" % sent)
            sent += 1
        producer.poll(0.05)
        now = time.monotonic()
        if cut_at is None and now - started > 3:
            network.partition(victim)
            cut_at = now
        if cut_at is not None and fenced_at is None and now - looked_at > 1:
            layout, looked_at = partitions(topic), now
            if all(leader != victim and victim not in isr for leader, isr in layout.values()):
                during, fenced_at = layout, now
            elif now - cut_at > 120:  # never fenced: the test's assertions say so
                network.heal(victim)
                break
        if fenced_at is not None and healed_at is None and now - fenced_at > 5:
            network.heal(victim)
            healed_at = now
    return sent, during


@pytest.mark.timeout(faults.timeout(300))
def test_a_partitioned_leader_loses_no_acknowledged_record_and_catches_up(
    isolated: tuple[LocalKafka, BrokerNetwork], spark: SparkSession, tmp_path: Path
) -> None:
    cluster, network = isolated
    topic = fresh_topic(cluster.kafka)
    acks = Acks()
    producer = acks_all_producer(topic, acks)
    victim = partitions(topic)[0][0]
    try:
        sent, during = _produce_across_a_cut(producer, topic, network, victim)
        assert network.is_partitioned(victim) is False
        assert producer.flush(150) == 0, f"{len(acks.acked)} of {sent} acknowledged"
    finally:
        network.heal(victim)
    assert acks.failed == [], acks.failed[:5]
    assert len(acks.acked) == sent
    # While it was cut off, the others led its partitions, and it was out of every ISR.
    assert during
    assert all(leader != victim for leader, _ in during.values()), during
    assert all(victim not in isr for _, isr in during.values()), during
    values = Counter(r.value for r in read_topic(topic, topic.topic))
    assert sorted(values) == sorted(acks.acked), "an acknowledged record is missing"
    assert max(values.values()) == 1, "a record was written twice"
    # Healed, it catches up: back in the in-sync replicas of every partition.
    wait_until(
        lambda: all(victim in isr for _, isr in partitions(topic).values()),
        timeout_s=120,
        what="the healed broker back in every ISR",
        poll_s=0.2,
    )
    # And the pipeline reads everything, once.
    lake = new_lake(tmp_path)
    run_archiver(spark, kafka=topic, lake=lake, settings=ArchiverSettings(), available_now=True)
    # (the values are not events: each record lands in master/rejected, with its reason)
    rejected = (
        DeltaTable(MASTER_REJECTED.path(lake))
        .to_pyarrow_table(columns=["kafka_partition", "kafka_offset"])
        .to_pylist()
    )
    assert len(rejected) == sent
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in rejected}) == sent


def test_ctr_kafka_partition_cuts_a_broker_off_and_heals_it(
    isolated: tuple[LocalKafka, BrokerNetwork],
) -> None:
    cluster, network = isolated
    env = {
        **os.environ,
        "KAFKA_RUN_DIR": str(cluster.settings.run_dir),
        "KAFKA_BOOTSTRAP_SERVERS": cluster.kafka.bootstrap_servers,
    }

    def ctr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CTR, "kafka", *args], env=env, capture_output=True, text=True, check=False
        )

    try:
        cut = ctr("partition", "2")
        assert cut.returncode == 0, cut.stderr
        assert "broker 2: cut off" in cut.stdout + cut.stderr
        assert network.is_partitioned(2)
        healed = ctr("partition", "2", "--heal")
        assert healed.returncode == 0, healed.stderr
        assert not network.is_partitioned(2)
    finally:
        network.heal(2)
    wrong = ctr("partition", "7")
    assert wrong.returncode != 0
    assert "node 7: the brokers are [1, 2, 3]" in wrong.stdout + wrong.stderr
