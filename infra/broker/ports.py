"""Ports of the local cluster: whether one is taken, a free one for tests."""

from __future__ import annotations

import socket
from collections.abc import Iterable

from infra.broker.errors import BrokerError
from infra.broker.layout import Node


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
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
