"""Reaching the cluster and creating the platform's topics with the Kafka Admin API."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from runtime.errors import SetupError
from runtime.kafka_settings import KafkaSettings


class KafkaUnavailableError(SetupError, RuntimeError):
    """No broker answered a metadata request in time."""


class KafkaAuthenticationError(KafkaUnavailableError):
    """The cluster refused the client's login, or closes the connections of a client that sends
    no credentials; the message says which settings to set."""


CREDENTIAL_SETTINGS = (
    "KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT (or SASL_SSL), KAFKA_SASL_MECHANISM, "
    "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
)


def admin_client(settings: KafkaSettings, **overrides: Any) -> AdminClient:
    return AdminClient(settings.client(**overrides))


def wait_for_cluster(settings: KafkaSettings, *, timeout_s: float) -> ClusterMetadata:
    """Return the cluster metadata once a broker answers; raise after ``timeout_s``
    (:class:`KafkaAuthenticationError` at once when a broker refuses the login or the TLS
    handshake fails)."""
    refused: list[KafkaError] = []
    admin = admin_client(
        settings,
        error_cb=lambda error: (
            refused.append(error)
            if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL)
            else None
        ),
        **{"socket.connection.setup.timeout.ms": 1000},
    )
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    probed = False
    while True:
        remaining = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.2, min(remaining, 2.0)))
        except KafkaException as exc:
            last_error = exc
        admin.poll(0)  # serves the error callback
        if refused:
            raise KafkaAuthenticationError(_refusal(settings, refused[-1]))
        if not probed:
            probed = True
            _raise_if_credentials_missing(settings)
        if time.monotonic() >= deadline:
            raise KafkaUnavailableError(
                f"no Kafka broker answered at {settings.bootstrap_servers} within "
                f"{timeout_s:g} s ({_describe(last_error)}); start one with 'make kafka-up' "
                "or set KAFKA_BOOTSTRAP_SERVERS"
            )
        time.sleep(0.2)


def _refusal(settings: KafkaSettings, error: KafkaError) -> str:
    if error.code() == KafkaError._SSL:
        return (
            f"the TLS handshake with Kafka at {settings.bootstrap_servers} failed: "
            f"{error.str()}; check KAFKA_SSL_CA_LOCATION (the CA the brokers' certificates "
            "chain to) and that the brokers' names are in their certificates"
        )
    return (
        f"Kafka at {settings.bootstrap_servers} refused the login ({settings.describe_auth()}): "
        f"{error.str()}; check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SASL_MECHANISM"
    )


def refused_topics(
    settings: KafkaSettings, names: list[str], *, timeout_s: float = 10.0
) -> list[str]:
    """Those of ``names`` the cluster refuses to describe to these settings' login (no ACL
    grants it any operation on them): a cluster with ACLs leaves them out of the metadata, as
    if they did not exist."""
    admin = admin_client(settings)
    refused = []
    for name in names:
        found = admin.list_topics(name, timeout=timeout_s).topics.get(name)
        error = None if found is None else found.error
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            refused.append(name)
    return refused


def check_login(settings: KafkaSettings, *, timeout_s: float = 10.0) -> None:
    """Fail fast, naming the settings to fix, if the cluster refuses these settings' login
    (:class:`KafkaAuthenticationError`); quiet when it answers, and when no broker answers at
    all (the caller's own retries wait for a broker that is still starting)."""
    try:
        wait_for_cluster(settings, timeout_s=timeout_s)
    except KafkaAuthenticationError:
        raise
    except KafkaUnavailableError:
        return


def _raise_if_credentials_missing(settings: KafkaSettings) -> None:
    """A client that sends no credentials to a broker whose listener wants a SASL login (the
    broker closes its connection at the first request, which looks like a network failure)."""
    if settings.uses_sasl:
        return
    for server in settings.servers:
        mechanisms = sasl_mechanisms(server)
        if mechanisms:
            raise KafkaAuthenticationError(
                f"the Kafka broker at {server} requires a SASL login ({', '.join(mechanisms)}) "
                f"and this client sends none (KAFKA_SECURITY_PROTOCOL="
                f"{settings.describe_auth()}): set {CREDENTIAL_SETTINGS} (for the local "
                "cluster of `ctr kafka up --auth scram`: source the role's env file, "
                "RUN_DIR/kafka/producer.env, consumer.env, monitor.env, or client.env for the "
                "admin)"
            )


_SASL_HANDSHAKE: Final = 17  # api key; version 1 (KIP-152), answered before any login
_CLIENT_ID: Final = b"ctr-lambda-probe"


def sasl_mechanisms(server: str, *, timeout_s: float = 2.0) -> list[str] | None:
    """The SASL mechanisms the listener at ``server`` (host:port) enables, asked with a
    SaslHandshake request, which a SASL listener answers before any login; None if it does
    not speak SASL (a PLAINTEXT listener answers with an error and no mechanisms; TLS or no
    listener: no answer)."""
    host, _, port = server.rpartition(":")
    request = struct.pack(">hhih", _SASL_HANDSHAKE, 1, 1, len(_CLIENT_ID)) + _CLIENT_ID
    request += struct.pack(">h", len(b"PLAIN")) + b"PLAIN"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack(">i", len(request)) + request)
            response = _read_response(sock)
    except (OSError, ValueError, struct.error):
        return None
    if response is None:
        return None
    # correlation id (int32), error code (int16), mechanisms: int32 count, int16-length strings
    _, _, count = struct.unpack_from(">ihi", response)
    mechanisms, offset = [], 10
    for _ in range(max(count, 0)):
        (length,) = struct.unpack_from(">h", response, offset)
        mechanisms.append(response[offset + 2 : offset + 2 + length].decode())
        offset += 2 + length
    return mechanisms or None


def _read_response(sock: socket.socket) -> bytes | None:
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">i", header)
    if not 10 <= size <= 65536:
        return None
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@dataclass(frozen=True)
class TopicResult:
    name: str
    status: Literal["created", "exists"]
    partitions: int


def ensure_topics(settings: KafkaSettings, *, timeout_s: float = 30.0) -> list[TopicResult]:
    """Create the event topic and the dead-letter topic if missing (idempotent), replicated
    as :meth:`KafkaSettings.effective_replication_factor` says for this cluster's size."""
    wanted = {
        settings.topic: settings.topic_partitions,
        settings.dlq_topic: settings.dlq_partitions,
    }
    brokers = len(wait_for_cluster(settings, timeout_s=timeout_s).brokers)
    # The broker stamps each record with its append time: `ingest_time` is when Kafka took the
    # record, and a producer's absurd CreateTime (which Spark's kafka source cannot convert)
    # never reaches a reader.
    config: dict[str, str] = {**settings.topic_config, "message.timestamp.type": "LogAppendTime"}
    min_insync = settings.effective_min_insync_replicas(brokers)
    if min_insync is not None:
        config["min.insync.replicas"] = str(min_insync)
    return create_topics(
        settings,
        wanted,
        replication_factor=settings.effective_replication_factor(brokers),
        config=config,
        timeout_s=timeout_s,
    )


def create_topics(
    settings: KafkaSettings,
    partitions_by_topic: dict[str, int],
    *,
    replication_factor: int = 1,
    config: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> list[TopicResult]:
    """Create each topic with its partition count unless it exists; report which was which."""
    metadata = wait_for_cluster(settings, timeout_s=timeout_s)
    admin = admin_client(settings)
    missing = [name for name in partitions_by_topic if name not in metadata.topics]
    if not missing:
        return [
            TopicResult(name, "exists", len(metadata.topics[name].partitions))
            for name in partitions_by_topic
        ]
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=partitions_by_topic[name],
                replication_factor=replication_factor,
                config=config or {},
            )
            for name in missing
        ],
        request_timeout=timeout_s,
    )
    created = set()
    for name, future in futures.items():
        try:
            future.result()
            created.add(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race: fine
                raise
    metadata = _wait_for_leaders(admin, list(partitions_by_topic), timeout_s)
    results = []
    for name, wanted in partitions_by_topic.items():
        topic = metadata.topics.get(name)
        count = len(topic.partitions) if topic is not None else wanted
        results.append(TopicResult(name, "created" if name in created else "exists", count))
    return results


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout_s: float) -> ClusterMetadata:
    """Metadata once every partition of ``names`` has a leader: a topic just created answers
    "not leader" to reads and writes until the controller has elected them."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=timeout_s)
        topics = [metadata.topics.get(name) for name in names]
        if (
            all(
                t is not None and t.partitions and all(p.leader >= 0 for p in t.partitions.values())
                for t in topics
            )
            or time.monotonic() > deadline
        ):
            return metadata
        time.sleep(0.05)


def delete_topics(settings: KafkaSettings, names: list[str], *, timeout_s: float = 30.0) -> None:
    admin = admin_client(settings)  # must outlive the futures
    futures = admin.delete_topics(names, request_timeout=timeout_s)
    for future in futures.values():
        future.result()


def _describe(error: Exception | None) -> str:
    if isinstance(error, KafkaException) and error.args:
        inner = error.args[0]
        return inner.str() if isinstance(inner, KafkaError) else str(inner)
    return str(error) if error else "no answer"
