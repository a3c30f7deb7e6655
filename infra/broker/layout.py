"""The local cluster's layout (its nodes, their roles and addresses, the cluster id, recorded in
``cluster.json``) and its state (the pid of each node's running JVM)."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import asdict, dataclass
from typing import Final

from infra.netns import BrokerNetwork

CONTROLLER_ID: Final = 0


@dataclass(frozen=True)
class Node:
    node_id: int
    roles: str  # "broker,controller", "broker" or "controller"
    host: str
    broker_port: int | None
    controller_port: int | None
    netns: str | None = None  # the network namespace it runs in (infra.netns), None: the host's

    @property
    def is_broker(self) -> bool:
        return self.broker_port is not None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.broker_port or self.controller_port}"


def new_cluster_id() -> str:
    """A random cluster id as Kafka writes them (URL-safe base64 of a UUID), never starting
    with ``-``: Kafka's own ``Uuid.randomUuid`` avoids that too, as command lines would read
    it as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class Layout:
    """The cluster's nodes and id, fixed when it is first started."""

    cluster_id: str
    nodes: tuple[Node, ...]
    network: BrokerNetwork | None = None  # the brokers' namespaces, if isolated
    auth: str | None = None  # the SCRAM mechanism the brokers' listener requires, if any
    tls: bool = False  # the listener is SASL_SSL (only with auth)

    @classmethod
    def create_isolated(
        cls,
        network: BrokerNetwork,
        broker_port: int,
        controller_port: int,
        *,
        auth: str | None = None,
        tls: bool = False,
    ) -> Layout:
        """A controller on the bridge (the machine's namespace) and a broker per namespace,
        each on its own address and the same port."""
        nodes = [Node(CONTROLLER_ID, "controller", network.gateway, None, controller_port)]
        nodes += [
            Node(i, "broker", network.host(i), broker_port, None, network.namespace(i))
            for i in range(1, network.brokers + 1)
        ]
        return cls(new_cluster_id(), tuple(nodes), network, auth, tls)

    @classmethod
    def create(
        cls,
        host: str,
        broker_ports: list[int],
        controller_port: int,
        *,
        auth: str | None = None,
        tls: bool = False,
    ) -> Layout:
        cluster_id = new_cluster_id()
        if len(broker_ports) == 1:
            nodes = [Node(1, "broker,controller", host, broker_ports[0], controller_port)]
        else:
            nodes = [Node(CONTROLLER_ID, "controller", host, None, controller_port)]
            nodes += [Node(i, "broker", host, p, None) for i, p in enumerate(broker_ports, 1)]
        return cls(cluster_id, tuple(nodes), auth=auth, tls=tls)

    @property
    def brokers(self) -> list[Node]:
        return [n for n in self.nodes if n.is_broker]

    @property
    def controller(self) -> Node:
        return next(n for n in self.nodes if "controller" in n.roles)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.brokers)

    def node(self, node_id: int) -> Node:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster ({[n.node_id for n in self.nodes]})")

    def to_json(self) -> str:
        raw: dict[str, object] = {
            "cluster_id": self.cluster_id,
            "nodes": [asdict(n) for n in self.nodes],
        }
        if self.network is not None:
            raw["network"] = asdict(self.network)
        if self.auth is not None:
            raw["auth"] = self.auth
        if self.tls:
            raw["tls"] = True
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> Layout:
        raw = json.loads(text)
        network = BrokerNetwork(**raw["network"]) if raw.get("network") else None
        nodes = tuple(Node(**n) for n in raw["nodes"])
        return cls(raw["cluster_id"], nodes, network, raw.get("auth"), bool(raw.get("tls")))


@dataclass(frozen=True)
class ClusterState:
    bootstrap_servers: str
    pids: dict[int, int | None]  # node id -> pid of the running JVM, None if not running
    started_by_us: bool

    @property
    def running(self) -> bool:
        return bool(self.pids) and all(pid is not None for pid in self.pids.values())
