"""Kafka authentication against the session's broker, which requires SASL/SCRAM logins: clients
without credentials or with a wrong password are refused, and say so; the settings' user (the
admin) round-trips records; Spark's kafka source logs in with the settings' credentials, a password
with quotes and backslashes included; a cluster of its own over TLS (SASL_SSL). Real broker
processes, no mocks."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pydantic import SecretStr
from pyspark.sql import SparkSession

from infra.broker import scratch_cluster
from infra.broker.acls import apply_bindings
from runtime.connectors import ARCHIVER_GROUP, read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.topics import (
    KafkaAuthenticationError,
    admin_client,
    ensure_topics,
    sasl_mechanisms,
    wait_for_cluster,
)
from tests.support.consume import read_topic

CTR = str(Path(sys.executable).with_name("ctr"))
# A refused client's record is reported failed after this long (librdkafka retries the
# connection meanwhile): the bound on every refusal below.
REFUSED_AFTER_MS = 4000


@pytest.fixture
def secured(topics: KafkaSettings) -> KafkaSettings:
    if not topics.uses_sasl:
        pytest.skip("the session's cluster (KAFKA_BOOTSTRAP_SERVERS) does not require logins")
    return topics


@pytest.fixture
def scratch_user(secured: KafkaSettings) -> Iterator[KafkaSettings]:
    """The settings logging in as a user of its own whose password has quotes, backslashes,
    spaces and non-ASCII characters (created through the Admin API, allowed to write and read
    the test's topic, deleted afterwards)."""
    user = f"tricky-{uuid.uuid4().hex[:6]}"
    password = 'p"a\\s s=w;o\\"rd ü'
    admin = admin_client(secured)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    upsert = UserScramCredentialUpsertion(user, info, password.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result()
    settings = secured.model_copy(
        update={"sasl_username": user, "sasl_password": SecretStr(password)}
    )
    topic = (ResourceType.TOPIC, secured.topic, ResourcePatternType.LITERAL)
    allowed = (f"User:{user}", "*")
    apply_bindings(
        secured,
        [
            AclBinding(*topic, *allowed, operation, AclPermissionType.ALLOW)
            for operation in (AclOperation.WRITE, AclOperation.READ)
        ],
    )
    # The controller has committed the user; the broker learns it from the metadata log.
    deadline = time.monotonic() + 30
    while True:
        try:
            wait_for_cluster(settings, timeout_s=5)
            break
        except KafkaAuthenticationError:
            assert time.monotonic() < deadline, "the new user was never accepted"
    yield settings
    from confluent_kafka.admin import UserScramCredentialDeletion

    deletion = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)
    for future in admin.alter_user_scram_credentials([deletion]).values():
        future.result()


def send_one(settings: KafkaSettings, value: bytes) -> tuple[KafkaError | None, list[KafkaError]]:
    """Produce one record; its delivery report's error (None: delivered) and the client's
    errors meanwhile."""
    errors: list[KafkaError] = []
    reports: list[KafkaError | None] = []
    producer = Producer(
        settings.client(
            acks="all",
            error_cb=errors.append,
            **{"message.timeout.ms": REFUSED_AFTER_MS},
        )
    )
    producer.produce(
        settings.topic, value=value, on_delivery=lambda error, _message: reports.append(error)
    )
    assert producer.flush(REFUSED_AFTER_MS / 1000 + 20) == 0  # reported, one way or the other
    [report] = reports
    return report, errors


def test_a_producer_without_credentials_is_refused(secured: KafkaSettings) -> None:
    anonymous = KafkaSettings(bootstrap_servers=secured.bootstrap_servers, topic=secured.topic)
    report, errors = send_one(anonymous, b"anonymous")
    assert report is not None
    assert report.code() == KafkaError._MSG_TIMED_OUT
    # The broker closes the connection at the first request that is not part of a login.
    assert {e.code() for e in errors} <= {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT}
    assert errors
    for server in secured.servers:
        assert sasl_mechanisms(server) == [secured.sasl_mechanism]
    with pytest.raises(KafkaAuthenticationError, match="requires a SASL login") as refused:
        wait_for_cluster(anonymous, timeout_s=10)
    assert "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD" in str(refused.value)
    assert read_topic(secured, secured.topic) == []


def test_a_producer_with_a_wrong_password_is_refused(secured: KafkaSettings) -> None:
    wrong = secured.model_copy(update={"sasl_password": SecretStr("not-the-password")})
    report, errors = send_one(wrong, b"wrong")
    assert report is not None
    assert report.code() == KafkaError._MSG_TIMED_OUT
    failures = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert failures
    assert "invalid credentials" in failures[0].str()
    with pytest.raises(KafkaAuthenticationError, match="refused the login") as refused:
        wait_for_cluster(wrong, timeout_s=10)
    assert "not-the-password" not in str(refused.value)
    assert read_topic(secured, secured.topic) == []


def test_the_settings_user_round_trips_a_record(secured: KafkaSettings) -> None:
    report, errors = send_one(secured, b"authenticated")
    assert report is None
    assert not [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    consumer = Consumer(
        secured.client(
            **{
                "group.id": f"auth-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.subscribe([secured.topic])
    deadline = time.monotonic() + 30
    received: list[bytes] = []
    try:
        while not received and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received.append(bytes(message.value() or b""))
    finally:
        consumer.close()
    assert received == [b"authenticated"]


def test_ctr_produce_without_credentials_names_the_settings(
    secured: KafkaSettings, kafka_env: dict[str, str]
) -> None:
    anonymous = {k: v for k, v in kafka_env.items() if not k.startswith("KAFKA_SASL_")}
    anonymous["KAFKA_SECURITY_PROTOCOL"] = "PLAINTEXT"
    done = subprocess.run(
        [CTR, "produce", "--events", "10"],
        env=anonymous,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "requires a SASL login" in done.stderr
    assert "KAFKA_SASL_PASSWORD" in done.stderr
    assert "Traceback" not in done.stderr


def test_ctr_archive_with_a_wrong_password_stops_with_the_cause(
    secured: KafkaSettings, kafka_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **kafka_env,
        "KAFKA_SASL_PASSWORD": "not-the-password",
        "LAKE_ROOT": str(tmp_path / "lake"),
        "CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
    }
    done = subprocess.run(
        [CTR, "archive", "--available-now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "refused the login" in done.stderr
    assert "KAFKA_SASL_PASSWORD" in done.stderr
    assert "not-the-password" not in done.stdout + done.stderr


def test_sparks_kafka_source_logs_in_with_the_settings_credentials(
    spark: SparkSession, scratch_user: KafkaSettings
) -> None:
    report, _ = send_one(scratch_user, b"via a tricky password")
    assert report is None
    rows = read_kafka(spark, scratch_user, stream=False, group_prefix=ARCHIVER_GROUP).collect()
    assert [bytes(r.value) for r in rows] == [b"via a tricky password"]


def test_sparks_kafka_source_with_a_wrong_password_fails_with_the_cause(
    spark: SparkSession, secured: KafkaSettings
) -> None:
    wrong = secured.model_copy(update={"sasl_password": SecretStr("not-the-password")})
    with pytest.raises(Exception, match=r"SaslAuthenticationException|Authentication failed"):
        read_kafka(spark, wrong, stream=False, group_prefix=ARCHIVER_GROUP).collect()


def test_a_tls_cluster_serves_librdkafka_and_spark_and_refuses_the_unverified(
    spark: SparkSession, tmp_path: Path
) -> None:
    """SASL_SSL: the brokers' certificate (made by keytool) is the clients' trust anchor, for
    librdkafka (ssl.ca.location) and for Spark's kafka source (a PEM trust store)."""
    with scratch_cluster(tmp_path / "run", auth="scram", tls=True, topic="tls") as (kafka, _):
        assert kafka.security_protocol == "SASL_SSL"
        assert kafka.ssl_ca_location is not None
        ensure_topics(kafka)
        report, _ = send_one(kafka, b"over tls")
        assert report is None
        rows = read_kafka(spark, kafka, stream=False, group_prefix=ARCHIVER_GROUP).collect()
        assert [bytes(r.value) for r in rows] == [b"over tls"]

        unverified = kafka.model_copy(update={"ssl_ca_location": None})
        with pytest.raises(KafkaAuthenticationError, match=r"TLS handshake .* failed") as failed:
            wait_for_cluster(unverified, timeout_s=10)
        assert "KAFKA_SSL_CA_LOCATION" in str(failed.value)
        in_clear = kafka.model_copy(
            update={"security_protocol": "SASL_PLAINTEXT", "ssl_ca_location": None}
        )
        report, _ = send_one(in_clear, b"in clear")
        assert report is not None
        assert report.code() == KafkaError._MSG_TIMED_OUT
        assert [r.value for r in read_topic(kafka, "tls")] == [b"over tls"]
