"""Reaching the cluster and creating the platform's topics with the Kafka Admin API."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from runtime.kafka_settings import KafkaSettings


class KafkaUnavailableError(RuntimeError):
    """No broker answered a metadata request in time."""


def admin_client(settings: KafkaSettings, **overrides: Any) -> AdminClient:
    return AdminClient(settings.client(**overrides))


def wait_for_cluster(settings: KafkaSettings, *, timeout_s: float) -> ClusterMetadata:
    """Return the cluster metadata once a broker answers; raise after ``timeout_s``."""
    admin = admin_client(settings, **{"socket.connection.setup.timeout.ms": 1000})
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.2, min(remaining, 2.0)))
        except KafkaException as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise KafkaUnavailableError(
                f"no Kafka broker answered at {settings.bootstrap_servers} within "
                f"{timeout_s:g} s ({_describe(last_error)}); start one with 'make kafka-up' "
                "or set KAFKA_BOOTSTRAP_SERVERS"
            )
        time.sleep(0.2)


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
