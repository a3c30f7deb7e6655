"""Ports of the local cluster: whether one is taken; a free one for tests is
:func:`infra.ports.free_port`."""

from __future__ import annotations

from collections.abc import Iterable

from infra.broker.errors import BrokerError
from infra.broker.layout import Node
from infra.ports import bindable, free_port

__all__ = ["check_ports", "free_port", "port_in_use"]


def check_ports(nodes: Iterable[Node]) -> None:
    """:class:`BrokerError` naming the port if another process listens on one of ``nodes``'."""
    for node in nodes:
        if node.netns is not None:
            continue  # its own namespace: nothing else listens there
        for port in (node.broker_port, node.controller_port):
            if port is not None and port_in_use(node.host, port):
                raise BrokerError(
                    f"port {port} on {node.host}, needed by Kafka node {node.node_id}, is "
                    f"taken by another process (ss -ltnp 'sport = :{port}' shows which); "
                    "stop it, or choose other ports with KAFKA_BOOTSTRAP_SERVERS / "
                    "KAFKA_CONTROLLER_PORT"
                )


def port_in_use(host: str, port: int) -> bool:
    return not bindable(port, host)
