"""The local Apache Kafka cluster's life cycle and `ctr kafka`, against real broker JVMs."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from infra.broker import BrokerError, LocalKafka, free_port
from infra.broker_settings import BrokerSettings
from infra.broker_watch import dead_nodes
from runtime.kafka_settings import KafkaSettings
from runtime.topics import (
    KafkaAuthenticationError,
    KafkaUnavailableError,
    ensure_topics,
    wait_for_cluster,
)
from tests.support.consume import read_topic

CTR = str(Path(sys.executable).with_name("ctr"))


def local_kafka(run_dir: Path) -> LocalKafka:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    return LocalKafka(kafka, BrokerSettings(run_dir=run_dir, controller_port=free_port()))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalKafka]:
    cluster = local_kafka(tmp_path)
    yield cluster
    cluster.stop(timeout_s=15, delete_data=True)


def test_records_and_committed_offsets_survive_a_restart(cluster: LocalKafka) -> None:
    first = cluster.start()
    assert first.running
    assert first.started_by_us
    assert cluster.start().pids == first.pids  # idempotent: no second JVM
    # KAFKA_JVM_OPTIONS (the suite sets some: tests/conftest.py) reaches each node's JVM.
    options = [o.encode() for o in BrokerSettings().jvm_arguments()]
    assert options, "KAFKA_JVM_OPTIONS is empty: tests/conftest.py sets it unless it is set"
    for pid in first.pids.values():
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert set(options) <= set(arguments)
    kafka = cluster.kafka
    ensure_topics(kafka)
    producer = Producer(kafka.client(**{"acks": "all"}))
    for n in range(500):
        producer.produce(kafka.topic, value=b"r%d" % n, key=b"k%d" % n)
    assert producer.flush(30) == 0
    group = kafka.client(**{"group.id": "durable", "enable.auto.commit": False})
    consumer = Consumer(group)
    consumer.commit(offsets=[TopicPartition(kafka.topic, 0, 7)], asynchronous=False)
    consumer.close()

    assert cluster.stop() is True
    for pid in first.pids.values():
        assert pid is not None
        assert (
            not Path(f"/proc/{pid}").exists()
            or b"kafka.Kafka" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
    with pytest.raises(KafkaUnavailableError, match="no Kafka broker answered"):
        wait_for_cluster(kafka, timeout_s=1)
    assert cluster.stop() is False  # nothing left to stop

    second = cluster.start()
    assert second.pids != first.pids
    assert sorted(r.value for r in read_topic(kafka, kafka.topic)) == sorted(
        b"r%d" % n for n in range(500)
    )
    consumer = Consumer(group)
    [committed] = consumer.committed([TopicPartition(kafka.topic, 0)], timeout=10)
    consumer.close()
    assert committed.offset == 7


def test_a_stale_pid_file_is_not_trusted(cluster: LocalKafka) -> None:
    layout = cluster.layout()
    node = layout.nodes[0]
    cluster.settings.kafka_dir.mkdir(parents=True)
    (cluster.settings.kafka_dir / "cluster.json").write_text(layout.to_json())
    cluster.node_dir(node).mkdir()
    (cluster.node_dir(node) / "kafka.pid").write_text(f"{os.getpid()}\n")  # alive, not Kafka
    assert cluster.state().running is False
    assert cluster.stop() is False  # and it must not kill the test process


def test_a_remote_address_is_not_started() -> None:
    with pytest.raises(BrokerError, match="not a loopback address"):
        LocalKafka(KafkaSettings(bootstrap_servers="kafka-1:9092"), BrokerSettings())


def test_a_taken_port_is_named(cluster: LocalKafka) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", cluster.port))
        squatter.listen()
        with pytest.raises(BrokerError, match=rf"port {cluster.port} on 127\.0\.0\.1.* is taken"):
            cluster.start()


def test_a_damaged_log_directory_is_named(cluster: LocalKafka) -> None:
    cluster.start()
    node = cluster.layout().nodes[0]
    cluster.stop()
    meta = cluster.node_dir(node) / "data" / "meta.properties"
    meta.write_text("version=1\ncluster.id=someone-else\nnode.id=1\n")
    with pytest.raises(BrokerError, match="belongs to another cluster or is damaged"):
        cluster.start()
    meta.unlink()
    with pytest.raises(BrokerError, match=r"holds files but no meta\.properties"):
        cluster.start()


def test_a_cluster_id_starting_with_a_dash_formats(
    cluster: LocalKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A random id starts with "-" one time in 64; kafka-storage must not read it as an option.
    monkeypatch.setattr("infra.broker.layout.new_cluster_id", lambda: "-N9qb7jZQJm2fN-7_CTq-w")
    cluster.start()
    assert cluster.layout().cluster_id == "-N9qb7jZQJm2fN-7_CTq-w"
    wait_for_cluster(cluster.kafka, timeout_s=30)


def fake_java(directory: Path, version_line: str) -> Path:
    java = directory / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return directory


def test_missing_or_old_java_is_named(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    nowhere = BrokerSettings(run_dir=tmp_path, java_home=tmp_path / "no-jdk")
    with pytest.raises(BrokerError, match="Java is not installed"):
        LocalKafka(kafka, nowhere).start()
    old = fake_java(tmp_path / "jdk11", 'openjdk version "11.0.2" 2019-01-15')
    with pytest.raises(BrokerError, match=r"needs Java 17 or newer; .* is 11"):
        LocalKafka(kafka, BrokerSettings(run_dir=tmp_path, java_home=old)).start()


def ctr_kafka(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CTR, "kafka", *args], env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_kafka_up_status_down_commands(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        KAFKA_CONTROLLER_PORT=str(free_port()),
        RUN_DIR=str(tmp_path),
        COLUMNS="200",
    )
    up = ctr_kafka(env, "up")
    try:
        assert up.returncode == 0, up.stderr
        assert "1 broker(s) at" in up.stderr
        assert "topic ad-events: created (6 partitions)" in up.stderr
        assert "topic ad-events-dlq: created (1 partitions)" in up.stderr
        again = ctr_kafka(env, "up")
        assert "topic ad-events: exists (6 partitions)" in again.stderr
        status = ctr_kafka(env, "status")
        assert status.returncode == 0, status.stderr
        assert "controller: node 1" in status.stdout
        rows = [line.split("│") for line in status.stdout.splitlines() if "│ ad-events" in line]
        assert len(rows) == 7
        # topic, partition, leader, replicas, isr, earliest, latest
        assert all([c.strip() for c in row[3:6]] == ["1", "1", "1"] for row in rows)
        three = ctr_kafka(env, "up", "--brokers", "3")
        assert three.returncode == 1
        assert "holds a 1-broker cluster, not 3" in three.stderr
    finally:
        down = ctr_kafka(env, "down")
    assert down.returncode == 0
    assert "stopped" in down.stderr
    assert ctr_kafka(env, "down").stderr.strip() == "broker: was not running"
    failed = ctr_kafka(env, "status")
    assert failed.returncode == 1
    assert "no Kafka broker answered" in failed.stderr
    assert "deleted" in ctr_kafka(env, "down", "--delete-data").stderr
    assert not (tmp_path / "kafka").exists()


def test_missing_jars_are_a_clear_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "RUN_DIR": str(tmp_path),
        "CTR_JAR_CACHE": str(tmp_path / "empty-cache"),
        "COLUMNS": "200",
    }
    up = ctr_kafka(env, "up")
    assert up.returncode == 1
    assert "the kafka jars are not in" in " ".join(up.stderr.split())
    assert "make setup" in up.stderr


def test_kafka_down_with_a_remote_cluster_stops_nothing(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": "kafka-1.example:9092",
        "RUN_DIR": str(tmp_path),
    }
    done = ctr_kafka(env, "down")
    assert "is not local; nothing to stop" in done.stderr
    assert not (tmp_path / "kafka").exists()


# -- SASL/SCRAM ---------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_scram_tls_cluster_of_three_brokers_keeps_its_credentials_across_restarts(
    tmp_path: Path,
) -> None:
    ports = [free_port() for _ in range(3)]
    kafka = KafkaSettings(bootstrap_servers=",".join(f"127.0.0.1:{p}" for p in ports))
    settings = BrokerSettings(
        run_dir=tmp_path, controller_port=free_port(), local_auth="scram", local_tls=True
    )
    cluster = LocalKafka(kafka, settings, brokers=3)
    try:
        first = cluster.start()
        layout = cluster.layout()
        assert layout.auth == "SCRAM-SHA-256"
        assert layout.tls
        kafka_dir = settings.kafka_dir
        credentials = json.loads((kafka_dir / "credentials.json").read_text())
        password = credentials["admin"]["password"]
        assert mode(kafka_dir) == 0o700
        for name in ["credentials.json", "client.env", "client.properties", "tls/broker.p12",
                     "tls/keystore.password"]:  # fmt: skip
            private = kafka_dir / name
            assert mode(private) == 0o600
        for node in layout.nodes:
            properties = cluster.node_dir(node) / "server.properties"
            assert mode(properties) == 0o600
            assert not (cluster.node_dir(node) / ".format-arguments").exists()
            pid = first.pids[node.node_id]
            assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        # Brokers replicate to each other over the SCRAM listener (TLS): acks=all, 3 replicas.
        assert cluster.kafka.sasl_username == "ctr-admin"
        assert cluster.kafka.security_protocol == "SASL_SSL"
        ensure_topics(cluster.kafka)
        producer = Producer(cluster.kafka.client(acks="all"))
        for n in range(100):
            producer.produce(cluster.kafka.topic, value=b"r%d" % n)
        assert producer.flush(60) == 0

        # The broker watch's view: settings from an environment without credentials.
        watch = LocalKafka(KafkaSettings(bootstrap_servers=kafka.bootstrap_servers),
                           BrokerSettings(run_dir=tmp_path))  # fmt: skip
        cluster.kill(2)
        assert dead_nodes(watch) == [2]
        watch.start(nodes=[2])
        assert dead_nodes(watch) == []
        assert watch.client_settings().sasl_username == "ctr-admin"

        assert cluster.stop() is True
        again = LocalKafka(kafka, BrokerSettings(run_dir=tmp_path))
        again.start()
        kept = json.loads((kafka_dir / "credentials.json").read_text())
        assert kept["admin"]["password"] == password
        records = read_topic(again.kafka, again.kafka.topic)
        assert sorted(r.value for r in records) == sorted(b"r%d" % n for n in range(100))

        plain = LocalKafka(kafka, BrokerSettings(run_dir=tmp_path, local_auth="none"))
        with pytest.raises(
            BrokerError, match="requires SCRAM-SHA-256 logins over TLS; to switch it to"
        ):
            plain.start()
        other = LocalKafka(kafka, BrokerSettings(run_dir=tmp_path, local_auth="scram-sha-512"))
        with pytest.raises(BrokerError, match="requires SCRAM-SHA-256 logins, not SCRAM-SHA-512"):
            other.layout()
    finally:
        cluster.stop(timeout_s=15, delete_data=True)


def exports(env_file: Path) -> dict[str, str]:
    """The variables an env file of ``ctr kafka up`` exports."""
    return dict(
        word.split("=", 1)
        for line in env_file.read_text().splitlines()
        if line.startswith("export ")
        for word in shlex.split(line)[1:]
    )


def test_kafka_up_with_auth_writes_the_clients_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        KAFKA_CONTROLLER_PORT=str(free_port()),
        RUN_DIR=str(tmp_path),
        COLUMNS="200",
    )
    bad = ctr_kafka(env, "up", "--auth", "kerberos")
    assert bad.returncode == 2
    assert "none, scram" in bad.stderr
    up = ctr_kafka(env, "up", "--auth", "scram")
    try:
        assert up.returncode == 0, up.stderr
        kafka_dir = tmp_path / "kafka"
        said = " ".join(up.stderr.split())
        for name in ("client.env", "producer.env", "consumer.env", "monitor.env"):
            assert str(kafka_dir / name) in said
            assert mode(kafka_dir / name) == 0o600
        password = json.loads((kafka_dir / "credentials.json").read_text())
        for role in ("admin", "producer", "consumer", "monitor"):
            assert password[role]["password"] not in up.stdout + up.stderr
        assert "topic ad-events: created (6 partitions)" in up.stderr
        # ctr kafka status/create-topics log in to the local cluster by themselves
        status = ctr_kafka(env, "status")
        assert status.returncode == 0, status.stderr
        assert "│ ad-events" in status.stdout
        admin, producer, consumer = (
            exports(kafka_dir / name) for name in ("client.env", "producer.env", "consumer.env")
        )
        assert admin["KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
        assert admin["KAFKA_SASL_USERNAME"] == "ctr-admin"
        assert admin["KAFKA_SASL_PASSWORD"] == password["admin"]["password"]
        assert producer["KAFKA_SASL_PASSWORD"] == password["producer"]["password"]
        produce = [CTR, "produce", "--events", "10"]
        sent = subprocess.run(produce, env={**env, **producer}, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        # The consumer's login may not see the dead-letter topic, and says so.
        wrong = subprocess.run(produce, env={**env, **consumer}, capture_output=True, text=True,
                               timeout=120, check=False)  # fmt: skip
        assert wrong.returncode == 1
        said = " ".join(wrong.stderr.split())
        assert "as 'ctr-consumer') may not use topic(s) ad-events-dlq" in said
        refused = subprocess.run(produce, env=env, capture_output=True, text=True,
                                 timeout=120, check=False)  # fmt: skip
        assert refused.returncode == 1
        assert "requires a SASL login (SCRAM-SHA-256)" in " ".join(refused.stderr.split())
    finally:
        ctr_kafka(env, "down", "--delete-data")


def test_a_cluster_formatted_without_logins_is_switched_to_scram_and_back(
    cluster: LocalKafka,
) -> None:
    cluster.start()
    plain = cluster.kafka
    ensure_topics(plain)
    producer = Producer(plain.client(acks="all"))
    for n in range(20):
        producer.produce(plain.topic, value=b"before %d" % n)
    assert producer.flush(30) == 0

    scram = LocalKafka(plain, cluster.settings.model_copy(update={"local_auth": "SCRAM-SHA-256"}))
    with pytest.raises(BrokerError, match=r"stop it first \(`ctr kafka down`: its data stays\)"):
        scram.start()
    cluster.stop()
    scram.start()
    assert scram.layout().auth == "SCRAM-SHA-256"
    assert scram.kafka.uses_sasl
    with pytest.raises(KafkaAuthenticationError, match="requires a SASL login"):
        wait_for_cluster(plain, timeout_s=10)
    records = read_topic(scram.kafka, plain.topic)
    assert sorted(r.value for r in records) == sorted(b"before %d" % n for n in range(20))

    # The same users after a restart, and back to no logins when asked.
    scram.stop()
    assert LocalKafka(plain, BrokerSettings(run_dir=cluster.settings.run_dir)).start().running
    wait_for_cluster(scram.kafka, timeout_s=30)
    cluster.stop()
    unset = LocalKafka(plain, cluster.settings)  # no KAFKA_LOCAL_AUTH: as the cluster is
    unset.start()
    assert unset.layout().auth == "SCRAM-SHA-256"
    unset.stop()
    none = LocalKafka(plain, cluster.settings.model_copy(update={"local_auth": "none"}))
    none.start()
    assert none.layout().auth is None
    assert len(read_topic(plain, plain.topic)) == 20
