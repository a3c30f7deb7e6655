"""Kafka's logins and ACLs on the session's broker (issue 66, findings 2 and 3): the KRaft
controller's listener takes only the brokers' and the admin's logins, as Kafka's own
``kafka-configs.sh`` finds; each role (producer, consumer, monitor, admin) does what its ACLs
grant and nothing else; a cluster whose credentials predate the roles gets them at its next
start. Real broker processes, Kafka's own tools and Spark, no mocks."""

from __future__ import annotations

import datetime as dt
import json
import stat
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from pyspark.sql import SparkSession

from api.topic_depth import TopicDepth
from infra.broker import BrokerError, LocalKafka, scratch_cluster
from infra.broker.acls import apply_grants, platform_grants
from infra.broker_auth import ROLES, Role, User, write_private
from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from lake.settings import LakeSettings
from master_dataset.archiver import run
from master_dataset.settings import ArchiverSettings
from runtime.jars import jar_dir
from runtime.kafka_settings import KafkaSettings, jaas_config
from runtime.offsets import offsets_consumer, topic_offsets
from runtime.topics import admin_client, ensure_topics
from tests.support.consume import read_topic
from tests.support.events import send, wire_event
from tests.support.kafka_tools import controller_address, kafka_configs

# What a node's server.properties has held since the roles (absent from an earlier one's).
CONFIGURED_SINCE = (
    "sasl.mechanism.controller.protocol",
    "listener.name.controller.",
    "authorizer.class.name",
    "super.users",
)
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
# A refused record is reported failed after this long at most.
REFUSED_AFTER_MS = 4000


@pytest.fixture
def cluster(local_kafka: LocalKafka | None) -> LocalKafka:
    if local_kafka is None:
        pytest.skip("the session's cluster is not a local one (KAFKA_BOOTSTRAP_SERVERS)")
    return local_kafka


@pytest.fixture
def logins(cluster: LocalKafka, topics: KafkaSettings) -> dict[Role, KafkaSettings]:
    """Each role's settings for this test's topics, whose ACLs are granted as `ctr kafka up`
    grants them on the platform's topics."""
    credentials = cluster.credentials()
    assert credentials is not None
    apply_grants(topics, credentials, platform_grants(topics))
    return {role: credentials.client_settings(topics, role) for role in ROLES}


def events(n: int) -> list[dict[str, object]]:
    return [wire_event(f"e{i}", "impression", NOW) for i in range(n)]


def plain_login(user: User) -> dict[str, str]:
    """Client properties of a SASL/PLAIN login (the controller listener's mechanism)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": jaas_config("PLAIN", user.username, user.password),
    }


def scram_login(kafka: KafkaSettings) -> dict[str, str]:
    """The Java client properties of ``kafka``'s SCRAM login (as Spark's source gets them)."""
    return {
        key.removeprefix("kafka."): value
        for key, value in kafka.spark_options().items()
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers"
    }


def send_plain(settings: KafkaSettings, value: bytes) -> KafkaError | None:
    """Produce one record without idempotence; its delivery report's error (None: delivered)."""
    reports: list[KafkaError | None] = []
    producer = Producer(settings.client(acks="all", **{"message.timeout.ms": REFUSED_AFTER_MS}))
    producer.produce(settings.topic, value=value, on_delivery=lambda e, _m: reports.append(e))
    assert producer.flush(REFUSED_AFTER_MS / 1000 + 20) == 0
    [report] = reports
    return report


def refused_read(settings: KafkaSettings, topic: str, timeout_s: float = 20.0) -> set[int]:
    """Fetch ``topic`` from its start with ``settings``' login: no record may come; the error
    codes that do, once the topic's refusal is among them (a group's refusal may come first:
    librdkafka looks up the coordinator of the group id every consumer needs)."""
    partitions = topic_offsets(settings, topic)
    consumer = offsets_consumer(settings, **{"enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, p.partition, p.earliest) for p in partitions])
    codes: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while KafkaError.TOPIC_AUTHORIZATION_FAILED not in codes:
            assert time.monotonic() < deadline, f"no refusal within {timeout_s:g} s: {codes}"
            for message in consumer.consume(num_messages=100, timeout=0.5):
                error = message.error()
                assert error is not None, "a record was read"
                codes.add(error.code())
    finally:
        consumer.close()
    return codes


def refused_code(action: Future[Any]) -> int:
    """The error code of a refused Admin API call."""
    with pytest.raises(KafkaException) as refused:
        action.result()
    return int(refused.value.args[0].code())


# -- the controller listener ----------------------------------------------------------------


def test_the_controller_listener_refuses_clients_without_the_brokers_or_the_admins_login(
    cluster: LocalKafka, tmp_path: Path
) -> None:
    """The probe's attack: `kafka-configs.sh --bootstrap-controller` with no login altered a
    broker setting and printed the broker's configuration."""
    node = str(cluster.layout().brokers[0].node_id)
    target = ["--bootstrap-controller", controller_address(cluster)]
    target += ["--entity-type", "brokers", "--entity-name", node]
    altered = kafka_configs(cluster, tmp_path, *target, "--alter", "--add-config",
                            "log.cleaner.threads=3")  # fmt: skip
    assert altered.returncode != 0
    described = kafka_configs(cluster, tmp_path, *target, "--describe", "--all")
    assert described.returncode != 0
    assert "log.dirs=" not in described.stdout

    credentials = cluster.credentials()
    assert credentials is not None
    as_producer = kafka_configs(
        cluster, tmp_path, *target, "--describe", "--all",
        login=plain_login(credentials.user("producer")),
    )  # fmt: skip
    assert as_producer.returncode != 0
    assert "Invalid username or password" in as_producer.stdout + as_producer.stderr
    as_admin = kafka_configs(
        cluster, tmp_path, *target, "--describe", "--all", login=plain_login(credentials.admin)
    )
    assert as_admin.returncode == 0, as_admin.stderr
    assert " log.cleaner.threads=1 " in as_admin.stdout  # the refused change did not happen


# -- the roles ------------------------------------------------------------------------------


def test_the_producer_login_writes_both_topics_and_nothing_else(
    cluster: LocalKafka, logins: dict[Role, KafkaSettings], tmp_path: Path
) -> None:
    producer, admin = logins["producer"], logins["admin"]
    # The platform's producer: idempotent, acks=all; the invalid record to the dead-letter topic.
    with EventProducer(producer, ProducerSettings()) as sending:
        sending.send_many((orjson.dumps(e), None) for e in events(3))
        sending.send(b"not json")
    assert sending.stats.lost == 0, sending.stats.errors
    assert len(read_topic(admin, admin.topic)) == 3
    assert [r.value for r in read_topic(admin, admin.dlq_topic)] == [b"not json"]

    refused_read(producer, producer.topic)
    client = admin_client(producer)
    created = client.create_topics([NewTopic(f"not-yours-{uuid.uuid4().hex[:6]}", 1, 1)])
    assert [refused_code(f) for f in created.values()] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    deleted = client.delete_topics([producer.topic])
    assert [refused_code(f) for f in deleted.values()] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert producer.topic in admin_client(admin).list_topics(timeout=10).topics
    # The SCRAM users, listed as the probe did (kafka-configs.sh; librdkafka 2.16's refused
    # DescribeUserScramCredentials crashes the process).
    users = kafka_configs(
        cluster, tmp_path, "--bootstrap-server", producer.bootstrap_servers,
        "--describe", "--entity-type", "users", login=scram_login(producer),
    )  # fmt: skip
    assert users.returncode != 0
    assert "ClusterAuthorizationException" in users.stdout + users.stderr
    assert "ctr-admin" not in users.stdout


def test_the_consumer_login_archives_the_topic_but_cannot_write_or_create(
    spark: SparkSession, logins: dict[Role, KafkaSettings], lake: LakeSettings
) -> None:
    consumer = logins["consumer"]
    send(logins["producer"], *events(4))
    archived = run(spark, kafka=consumer, lake=lake, settings=ArchiverSettings(),
                   available_now=True)  # fmt: skip
    assert archived == 4

    report = send_plain(consumer, b"forged")
    assert report is not None
    assert report.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    client = admin_client(consumer)  # must outlive its futures
    created = client.create_topics([NewTopic(f"x-{uuid.uuid4().hex[:6]}", 1, 1)])
    assert [refused_code(f) for f in created.values()] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert len(read_topic(logins["admin"], consumer.topic)) == 4


def test_the_monitor_login_sees_the_dead_letter_depth_and_no_record(
    logins: dict[Role, KafkaSettings],
) -> None:
    monitor = logins["monitor"]
    with EventProducer(logins["producer"], ProducerSettings()) as sending:
        sending.send_many([(b"{broken", None), (b"[]", None), (orjson.dumps(events(1)[0]), None)])
    depth = TopicDepth(monitor, monitor.dlq_topic, timeout_s=10, refresh_s=0)
    assert depth.records() == 2
    for topic in (monitor.topic, monitor.dlq_topic):  # each holds records
        refused_read(monitor, topic)
    report = send_plain(monitor, b"forged")
    assert report is not None
    assert report.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_the_admin_login_holds_every_right(logins: dict[Role, KafkaSettings]) -> None:
    admin = admin_client(logins["admin"])
    users = admin.describe_user_scram_credentials().result(timeout=30)  # type: ignore[union-attr]
    names = {"ctr-broker", "ctr-admin", "ctr-producer", "ctr-consumer", "ctr-monitor"}
    assert names <= set(users)
    name = f"admin-{uuid.uuid4().hex[:6]}"
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result()
    for future in admin.delete_topics([name]).values():
        future.result()


# -- a cluster from before the roles --------------------------------------------------------


def test_a_cluster_from_before_the_roles_gets_their_users_and_acls_at_its_next_start(
    tmp_path: Path,
) -> None:
    """Still running as the earlier version started it, it is told to restart; restarted, it
    has the roles' users, their ACLs and their env files, and its client user is its admin."""
    with scratch_cluster(tmp_path / "run", auth="scram") as (kafka, cluster):
        # Made as the earlier version made it: the brokers' user and one client user, "ctr",
        # in the metadata and in credentials.json.
        old = User("ctr", "the-old-client-password")
        admin = admin_client(kafka)
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
        changes: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(old.username, info, old.password.encode())
        ]
        changes += [
            UserScramCredentialDeletion(name, ScramMechanism.SCRAM_SHA_256)
            for name in ("ctr-producer", "ctr-consumer", "ctr-monitor", "ctr-admin")
        ]
        for future in admin.alter_user_scram_credentials(changes).values():
            future.result()
        cluster.stop()
        credentials_file = cluster.settings.kafka_dir / "credentials.json"
        before = json.loads(credentials_file.read_text())
        legacy = {"mechanism": before["mechanism"], "broker": before["broker"],
                  "client": {"username": old.username, "password": old.password}}  # fmt: skip
        credentials_file.write_text(json.dumps(legacy))
        for name in ("producer.env", "consumer.env", "monitor.env"):
            (cluster.settings.kafka_dir / name).unlink()
        # Running as the earlier version ran it: no authorizer, the controller's listener
        # PLAINTEXT (the node's configuration of then).
        layout = cluster.layout()
        [node] = layout.nodes
        properties = cluster.node_dir(node) / "server.properties"
        lines = properties.read_text().splitlines(keepends=True)
        then = "".join(line for line in lines if not line.startswith(CONFIGURED_SINCE))
        write_private(properties, then.replace("CONTROLLER:SASL_PLAINTEXT", "CONTROLLER:PLAINTEXT"))
        classpath = f"{jar_dir('kafka', cluster.settings.jar_cache)}/*"
        cluster.nodes.spawn(layout, node, cluster.settings.java, classpath)

        again = LocalKafka(KafkaSettings(bootstrap_servers=kafka.bootstrap_servers),
                           cluster.settings)  # fmt: skip
        told = (
            r"has no authorizer \(No Authorizer is configured\.\).*; restart it \(`ctr kafka down`"
        )
        with pytest.raises(BrokerError, match=told):
            again.start()
        again.stop()
        again.start()
        assert again.kafka.sasl_username == "ctr"  # the old client user is the admin
        kept = json.loads(credentials_file.read_text())
        assert kept["admin"] == {"username": "ctr", "password": old.password}
        assert {kept[role]["username"] for role in ("producer", "consumer", "monitor")} == {
            "ctr-producer", "ctr-consumer", "ctr-monitor"
        }  # fmt: skip
        assert stat.S_IMODE(credentials_file.stat().st_mode) == 0o600
        env = (cluster.settings.kafka_dir / "producer.env").read_text()
        assert "KAFKA_SASL_USERNAME=ctr-producer" in env
        assert stat.S_IMODE((cluster.settings.kafka_dir / "producer.env").stat().st_mode) == 0o600

        ensure_topics(again.kafka)  # the admin's right
        producer = again.client_settings(role="producer")
        assert send_plain(producer, b"from an ad server") is None
        report = send_plain(again.client_settings(role="consumer"), b"forged")
        assert report is not None
        assert report.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert [r.value for r in read_topic(again.kafka, kafka.topic)] == [b"from an ad server"]
