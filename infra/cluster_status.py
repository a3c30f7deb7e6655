"""What `ctr kafka status` reports: brokers, the controller, and per partition its leader,
replicas, in-sync replicas and offsets."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.kafka_settings import KafkaSettings
from runtime.offsets import partition_offsets
from runtime.topics import wait_for_cluster


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    leader: int  # -1: no leader (every replica is down)
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    earliest: int
    latest: int

    @property
    def records(self) -> int:
        return self.latest - self.earliest

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True)
class ClusterStatus:
    cluster_id: str | None
    brokers: dict[int, str]  # broker id -> host:port
    controller_id: int  # as the brokers report it (in KRaft: a broker standing in for it)
    partitions: list[PartitionStatus]

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
    offsets = {
        (o.topic, o.partition): o
        for o in partition_offsets(
            settings,
            [(t, p) for t, p in wanted if metadata.topics[t].partitions[p].leader >= 0],
            timeout_s=timeout_s,
        )
    }
    partitions = []
    for topic, number in wanted:
        meta = metadata.topics[topic].partitions[number]
        found = offsets.get((topic, number))
        partitions.append(
            PartitionStatus(
                topic=topic,
                partition=number,
                leader=meta.leader,
                replicas=tuple(meta.replicas),
                isr=tuple(meta.isrs),
                earliest=found.earliest if found else -1,
                latest=found.latest if found else -1,
            )
        )
    return ClusterStatus(
        cluster_id=metadata.cluster_id,
        brokers={b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()},
        controller_id=metadata.controller_id,
        partitions=partitions,
    )
