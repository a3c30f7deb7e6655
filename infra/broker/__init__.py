"""Apache Kafka on this machine: a KRaft cluster of 1 or 3 brokers, its state under RUN_DIR.

The local default only: point ``KAFKA_BOOTSTRAP_SERVERS`` at a real cluster and nothing here
runs. The broker is Apache Kafka's own (``kafka.Kafka``) from the jars `make setup` fetched
from Maven Central (``infra/kafka/pom.xml``), one JVM per node:

- **1 broker**: node 1 is broker and controller (combined mode), the broker on the bootstrap
  port (9092), its controller listener on ``KAFKA_CONTROLLER_PORT`` (default: that port + 100).
- **3 brokers**: nodes 1-3 are brokers on three consecutive ports (9092-9094); node 0 is the
  KRaft controller (a quorum of one) on the controller port. Stopping or killing brokers never
  touches the metadata quorum, so the replication guarantees can be tested broker by broker.

``RUN_DIR/kafka/cluster.json`` records the layout and the cluster id; each node keeps its
configuration, log (``server.log``), pid file and log directory (``data/``) under
``RUN_DIR/kafka/node-N``. The data survives ``stop``: the next ``start`` serves every record
and every committed offset again.

With ``KAFKA_LOCAL_AUTH=scram`` (``ctr kafka up --auth scram``) the brokers' listener requires
SASL/SCRAM logins, the brokers' own included; see :mod:`infra.broker_auth` for the credentials.

The modules: :mod:`~infra.broker.cluster` (:class:`LocalKafka`, the one object callers hold),
:mod:`~infra.broker.layout` (the nodes and ``cluster.json``), :mod:`~infra.broker.node` (each
node's files and JVM), :mod:`~infra.broker.logins` (none or SCRAM, over TLS or not),
:mod:`~infra.broker.health` (the wait for the brokers to register),
:mod:`~infra.broker.properties` (``server.properties``), :mod:`~infra.broker.processes` (pids,
Java), :mod:`~infra.broker.ports`, :mod:`~infra.broker.scratch` (clusters for tests).
"""

from __future__ import annotations

from infra.broker.cluster import LocalKafka
from infra.broker.errors import BrokerError
from infra.broker.layout import ClusterState, Layout, Node
from infra.broker.ports import free_port, port_in_use
from infra.broker.processes import is_alive, read_pid
from infra.broker.scratch import scratch_broker, scratch_cluster

__all__ = [
    "BrokerError",
    "ClusterState",
    "Layout",
    "LocalKafka",
    "Node",
    "free_port",
    "is_alive",
    "port_in_use",
    "read_pid",
    "scratch_broker",
    "scratch_cluster",
]
