"""Partition offsets that can be trusted, on Apache Kafka and on the embedded Tansu broker.

Tansu 0.6 (memory storage) answers ListOffsets "latest" with the base offset of the partition's
last record batch + 1 instead of its last offset + 1: after one produce of 5 records it says 1,
not 5. Its Fetch responses carry the right high watermark, so the end is verified by fetching
from ``reported_end - 1`` until the client reports end of partition. On Apache Kafka the two
agree and the check costs one small fetch per non-empty partition.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from infra.kafka_settings import KafkaSettings


@dataclass(frozen=True, order=True)
class PartitionOffsets:
    topic: str
    partition: int
    earliest: int
    latest: int  # one past the last record: the next offset to be written
    reported_latest: int  # what ListOffsets said before verification

    @property
    def records(self) -> int:
        return self.latest - self.earliest


def offsets_consumer(settings: KafkaSettings, **overrides: Any) -> Consumer:
    """A consumer for reading by explicit offsets: no group membership, no commits."""
    return Consumer(
        settings.client(
            **{
                "group.id": "ctr-lambda-offsets",  # required by librdkafka, never joined
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,  # answer "end of partition" quickly
                **overrides,
            }
        )
    )


def partition_offsets(
    settings: KafkaSettings,
    partitions: Iterable[tuple[str, int]],
    *,
    timeout_s: float = 10.0,
    consumer: Consumer | None = None,
) -> list[PartitionOffsets]:
    """Earliest and verified latest offsets of each (topic, partition)."""
    own = consumer is None
    client = consumer if consumer is not None else offsets_consumer(settings)
    try:
        reported: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, partition in partitions:
            low, high = client.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s, cached=False
            )
            reported[(topic, partition)] = (low, high)
        verified = _verify_ends(client, reported, timeout_s)
    finally:
        if own:
            client.close()
    return sorted(
        PartitionOffsets(t, p, low, max(high, verified.get((t, p), high)), high)
        for (t, p), (low, high) in reported.items()
    )


def topic_offsets(
    settings: KafkaSettings,
    topic: str,
    *,
    timeout_s: float = 10.0,
    consumer: Consumer | None = None,
) -> list[PartitionOffsets]:
    """Earliest and verified latest offsets of every partition of ``topic``; LookupError if
    the cluster does not have it."""
    own = consumer is None
    client = consumer if consumer is not None else offsets_consumer(settings)
    try:
        found = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            why = found.error if found is not None and found.error is not None else "no partitions"
            raise LookupError(f"topic {topic} not found on {settings.bootstrap_servers} ({why})")
        partitions = [(topic, p) for p in sorted(found.partitions)]
        return partition_offsets(settings, partitions, timeout_s=timeout_s, consumer=client)
    finally:
        if own:
            client.close()


def _verify_ends(
    client: Consumer, reported: dict[tuple[str, int], tuple[int, int]], timeout_s: float
) -> dict[tuple[str, int], int]:
    """Fetch from ``high - 1`` of each non-empty partition; the end-of-partition event
    carries the true end offset."""
    pending = {key: high for key, (low, high) in reported.items() if high > low}
    if not pending:
        return {}
    ends: dict[tuple[str, int], int] = {}
    client.assign([TopicPartition(t, p, high - 1) for (t, p), high in pending.items()])
    deadline = time.monotonic() + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            for message in client.consume(num_messages=10_000, timeout=0.05):
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                if topic is None or partition is None or offset is None:
                    continue
                key = (topic, partition)
                error = message.error()
                if error is None:
                    ends[key] = max(ends.get(key, 0), offset + 1)
                elif error.code() == KafkaError._PARTITION_EOF:
                    ends[key] = max(ends.get(key, 0), offset)
                    pending.pop(key, None)
    finally:
        client.unassign()
    return ends
