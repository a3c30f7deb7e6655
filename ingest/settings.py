"""The producer's settings (environment variables PRODUCER_*)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProducerSettings(BaseSettings):
    """Producer tuning (environment variables ``PRODUCER_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRODUCER_", extra="ignore")

    linger_ms: int = Field(default=20, ge=0)
    batch_bytes: int = Field(default=1_048_576, ge=1024)
    compression: str = "lz4"
    queue_max_messages: int = Field(default=500_000, ge=1000)
    delivery_timeout_ms: int = Field(default=120_000, ge=1000)
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
