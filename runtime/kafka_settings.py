"""How every component reaches Kafka: one settings object, read from the environment."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_HOSTS = frozenset({"localhost", "ip6-localhost"})
# librdkafka logs every refused connection to stderr unless given a logger.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")


class KafkaSettings(BaseSettings):
    """Kafka connection and topic layout (environment variables ``KAFKA_*``).

    ``client_config`` carries extra librdkafka properties for a real cluster, e.g.
    ``KAFKA_CLIENT_CONFIG='{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}'``.
    """

    model_config = SettingsConfigDict(env_prefix="KAFKA_", extra="ignore")

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "ad-events"
    dlq_topic: str = "ad-events-dlq"
    topic_partitions: int = Field(default=6, ge=1)
    dlq_partitions: int = Field(default=1, ge=1)
    # Unset: as many replicas as the cluster has brokers, at most 3, and
    # min.insync.replicas=2 with 3 replicas, so that acks=all survives the loss of one broker.
    replication_factor: int | None = Field(default=None, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    client_config: dict[str, Any] = Field(default_factory=dict)
    # Topic-level settings for the topics `ctr kafka up` / `create-topics` creates, e.g. the
    # disk they may hold: KAFKA_TOPIC_CONFIG='{"retention.bytes": "1073741824"}' (per
    # partition). Unset: the broker's defaults (7 days, no size bound). Existing topics keep
    # theirs (kafka-configs.sh --alter changes them).
    topic_config: dict[str, str] = Field(default_factory=dict)

    @field_validator("bootstrap_servers")
    @classmethod
    def _normalise_servers(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",") if part.strip()]
        if not servers:
            raise ValueError("KAFKA_BOOTSTRAP_SERVERS must name at least one host:port")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"KAFKA_BOOTSTRAP_SERVERS: {server!r} is not host:port")
        return ",".join(servers)

    @property
    def is_loopback(self) -> bool:
        """True when every bootstrap server is on this machine (the local-cluster case)."""
        return all(_is_loopback_host(s.rpartition(":")[0]) for s in self.servers)

    def effective_replication_factor(self, brokers: int) -> int:
        """Replicas per partition on a cluster of ``brokers`` brokers."""
        if self.replication_factor is not None:
            return self.replication_factor
        return max(1, min(3, brokers))

    def effective_min_insync_replicas(self, brokers: int) -> int | None:
        """``min.insync.replicas`` of the topics (None: the broker's default, 1)."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return 2 if self.effective_replication_factor(brokers) >= 3 else None

    @property
    def servers(self) -> list[str]:
        return self.bootstrap_servers.split(",")

    def client(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration for a producer, consumer or admin client."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "logger": LIBRDKAFKA_LOG,
            **self.client_config,
            **overrides,
        }


def _is_loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
