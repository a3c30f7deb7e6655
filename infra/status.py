"""What `ctr kafka status` reports: brokers, topics, partitions and their offsets."""

from __future__ import annotations

from dataclasses import dataclass

from infra.kafka_settings import KafkaSettings
from infra.offsets import PartitionOffsets, partition_offsets
from infra.topics import wait_for_cluster


@dataclass(frozen=True)
class ClusterStatus:
    cluster_id: str | None
    brokers: list[str]
    controller_id: int
    partitions: list[PartitionOffsets]

    @property
    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})


def cluster_status(
    settings: KafkaSettings, *, topics: list[str] | None = None, timeout_s: float = 10.0
) -> ClusterStatus:
    """Describe the cluster; ``topics`` defaults to every non-internal topic."""
    metadata = wait_for_cluster(settings, timeout_s=timeout_s)
    names = topics or sorted(t for t in metadata.topics if not t.startswith("__"))
    missing = [t for t in names if t not in metadata.topics]
    if missing:
        raise LookupError(f"topic(s) not found on {settings.bootstrap_servers}: {missing}")
    wanted = [(t, p) for t in names for p in sorted(metadata.topics[t].partitions)]
    return ClusterStatus(
        cluster_id=metadata.cluster_id,
        brokers=sorted(f"{b.id}@{b.host}:{b.port}" for b in metadata.brokers.values()),
        controller_id=metadata.controller_id,
        partitions=partition_offsets(settings, wanted, timeout_s=timeout_s),
    )
