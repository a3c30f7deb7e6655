"""The producer's settings (environment variables PRODUCER_*)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProducerSettings(BaseSettings):
    """Producer tuning (environment variables ``PRODUCER_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRODUCER_", extra="ignore")

    # Milliseconds a record may wait for others to fill its batch before it is sent
    # (librdkafka's linger.ms); 0: sent at once.
    linger_ms: int = Field(default=20, ge=0)
    # The most bytes of records in one batch to a partition (librdkafka's batch.size).
    batch_bytes: int = Field(default=1_048_576, ge=1024)
    # How batches are compressed (librdkafka's compression.type): lz4, zstd, gzip, snappy or
    # none.
    compression: str = "lz4"
    # Records the producer's local queue holds at most (queue.buffering.max.messages); when it
    # is full, sending waits for deliveries to make room.
    queue_max_messages: int = Field(default=500_000, ge=1000)
    # Milliseconds librdkafka keeps trying to deliver a record (message.timeout.ms); past it
    # the record is counted and reported as lost.
    delivery_timeout_ms: int = Field(default=120_000, ge=1000)
    # Seconds a flush (leaving the producer, at the end of a run) waits for outstanding
    # deliveries; what is still undelivered then is counted and reported as lost.
    flush_timeout_s: float = Field(default=60.0, gt=0)
    # "errors": librdkafka reports only failures and successes are counted as sent minus
    # failed once flushed (the fast default); "all": a report per record.
    delivery_reports: Literal["errors", "all"] = "errors"

    def client_overrides(self) -> dict[str, Any]:
        return {
            "enable.idempotence": True,
            # Same key -> partition mapping as the Java client, so producers in any language
            # agree on where an impression's events live.
            "partitioner": "murmur2_random",
            "acks": "all",
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "batch.size": self.batch_bytes,
            "queue.buffering.max.messages": self.queue_max_messages,
            "message.timeout.ms": self.delivery_timeout_ms,
            "delivery.report.only.error": self.delivery_reports == "errors",
        }
