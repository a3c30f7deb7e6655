"""Whether the local cluster answers: its metadata, and the wait for its brokers to register."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import ClusterMetadata

from infra.broker.errors import BrokerError
from infra.broker.layout import Layout
from infra.broker.node import Nodes
from infra.broker.processes import first_error, is_alive, read_pid, reap, tail
from runtime.kafka_settings import KafkaSettings
from runtime.topics import KafkaUnavailableError, admin_client


def metadata(settings: KafkaSettings, *, timeout_s: float) -> ClusterMetadata:
    admin = admin_client(settings, **{"socket.connection.setup.timeout.ms": 1000})
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailableError(str(exc.args[0]) if exc.args else str(exc)) from None


def answers(settings: KafkaSettings) -> bool:
    """Something (a Kafka) answers on ``settings``' bootstrap address within half a second."""
    try:
        metadata(settings, timeout_s=0.5)
    except KafkaUnavailableError:
        return False
    return True


def wait_ready(nodes: Nodes, layout: Layout, brokers: set[int], clients: KafkaSettings) -> None:
    """Wait until the nodes started are alive and the ``brokers`` are registered (asked
    with ``clients``, the cluster's client settings)."""
    settings = nodes.settings
    deadline = time.monotonic() + settings.start_timeout_s
    wanted = brokers
    last = "no answer"
    while True:
        for node in layout.nodes:
            if node.is_broker and node.node_id not in brokers:
                continue
            pid = read_pid(nodes.pid_file(node))
            if pid is None or not is_alive(pid):
                reap(pid)
                raise BrokerError(
                    f"Kafka node {node.node_id} exited during start-up: "
                    f"{first_error(tail(nodes.log_file(node), 200))} "
                    f"(log: {nodes.log_file(node)})"
                )
        try:
            brokers = set(metadata(clients, timeout_s=1.0).brokers)
            if wanted <= brokers:
                return
            last = f"brokers {sorted(brokers)} of {sorted(wanted)} registered"
        except KafkaUnavailableError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise BrokerError(
                f"the local Kafka cluster did not come up within "
                f"{settings.start_timeout_s:g} s ({last}); logs under {settings.kafka_dir}"
            )
        time.sleep(0.2)
