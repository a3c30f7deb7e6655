"""Partition offsets (earliest, latest) of Kafka topics, read with ListOffsets."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from runtime.kafka_settings import KafkaSettings

# Answers a partition gives while its leadership moves (a new topic, a broker failing over).
_TRANSIENT: Final = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        # A leader just elected (a restart, a failover) until its high watermark caught up.
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
    }
)


@dataclass(frozen=True, order=True)
class PartitionOffsets:
    topic: str
    partition: int
    earliest: int
    latest: int  # one past the last record: the next offset to be written

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
    """Earliest and latest offsets of each (topic, partition), asked of its leader (asked again
    while leadership moves, up to ``timeout_s``)."""
    own = consumer is None
    client = consumer if consumer is not None else offsets_consumer(settings)
    deadline = time.monotonic() + timeout_s
    try:
        found = []
        for topic, partition in partitions:
            while True:
                try:
                    low, high = client.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=timeout_s, cached=False
                    )
                    break
                except KafkaException as exc:
                    if exc.args[0].code() not in _TRANSIENT or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            found.append(PartitionOffsets(topic, partition, low, high))
    finally:
        if own:
            client.close()
    return sorted(found)


def topic_offsets(
    settings: KafkaSettings,
    topic: str,
    *,
    timeout_s: float = 10.0,
    consumer: Consumer | None = None,
) -> list[PartitionOffsets]:
    """Earliest and latest offsets of every partition of ``topic``; LookupError if the
    cluster does not have it."""
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
