"""Local clusters of their own for tests and benchmarks: on free ports, deleted afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.broker.cluster import LocalKafka
from infra.broker.ports import free_port
from infra.broker_settings import BrokerSettings
from runtime.kafka_settings import KafkaSettings


@contextmanager
def scratch_cluster(
    run_dir: Path,
    *,
    brokers: int = 1,
    topic: str = "ad-events",
    auth: str = "none",
    tls: bool = False,
) -> Iterator[tuple[KafkaSettings, LocalKafka]]:
    """A local cluster of its own on free ports (tests, benchmarks), deleted afterwards; with
    ``auth`` (``scram``, ...) the settings yielded carry its client user's credentials (and,
    with ``tls``, its certificate as their trust anchor)."""
    ports = [free_port() for _ in range(brokers)]
    kafka = KafkaSettings(bootstrap_servers=",".join(f"127.0.0.1:{p}" for p in ports), topic=topic)
    settings = BrokerSettings(
        run_dir=run_dir, controller_port=free_port(), local_auth=auth, local_tls=tls
    )
    cluster = LocalKafka(kafka, settings, brokers=brokers)
    cluster.start()
    try:
        yield cluster.kafka, cluster
    finally:
        cluster.stop(timeout_s=15, delete_data=True)


@contextmanager
def scratch_broker(
    run_dir: Path, topic: str = "ad-events", *, auth: str = "none"
) -> Iterator[KafkaSettings]:
    """One local broker of its own on free ports (tests, benchmarks), deleted afterwards."""
    with scratch_cluster(run_dir, topic=topic, auth=auth) as (kafka, _):
        yield kafka
