"""Read a whole topic back, by explicit offsets up to its verified end, and where the archiver
put each record (test support)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import TopicPartition

from runtime.kafka_settings import KafkaSettings
from runtime.offsets import offsets_consumer, topic_offsets


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


def read_topic(settings: KafkaSettings, topic: str, timeout_s: float = 30.0) -> list[Consumed]:
    ends = {p.partition: p for p in topic_offsets(settings, topic)}
    consumer = offsets_consumer(settings, **{"enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, p, ends[p].earliest) for p in ends])
    remaining = {p: e.latest - e.earliest for p, e in ends.items() if e.latest > e.earliest}
    records: list[Consumed] = []
    deadline = time.monotonic() + timeout_s
    try:
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                partition, offset = message.partition(), message.offset()
                assert partition is not None
                assert offset is not None
                key, value = message.key(), message.value()
                raw_headers = message.headers() or []
                pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
                headers = {
                    str(k): v.encode() if isinstance(v, str) else (v or b"") for k, v in pairs
                }
                records.append(
                    Consumed(
                        partition,
                        offset,
                        key if isinstance(key, bytes) else None,
                        value if isinstance(value, bytes) else b"",
                        headers,
                    )
                )
                remaining[partition] -= 1
                if remaining[partition] == 0:
                    del remaining[partition]
    finally:
        consumer.close()
    if remaining:
        raise AssertionError(f"timed out reading {topic}: still missing {remaining}")
    return records


def coordinates(archived: pa.Table) -> list[tuple[int, int]]:
    """(partition, offset) of each row of an archived table (master/events, master/rejected),
    to compare with the records :func:`read_topic` returns."""
    partitions = archived.column("kafka_partition").to_pylist()
    offsets = archived.column("kafka_offset").to_pylist()
    return list(zip(partitions, offsets, strict=True))
