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
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    ClusterMetadata,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from infra.broker_auth import (
    Credentials,
    CredentialsError,
    ensure_tls,
    load_credentials,
    load_or_create_credentials,
    load_tls,
    write_client_env,
    write_client_properties,
    write_private,
)
from infra.broker_settings import BrokerSettings
from infra.netns import BrokerNetwork, NetnsError
from runtime.jars import INFRA, JarsMissingError, jar_dir
from runtime.kafka_settings import KafkaSettings
from runtime.topics import KafkaUnavailableError, admin_client

KAFKA_MAIN: Final = "kafka.Kafka"
STORAGE_TOOL: Final = "kafka.tools.StorageTool"
LOG4J_CONFIG: Final = INFRA / "kafka" / "log4j2.properties"
CONTROLLER_ID: Final = 0
MIN_JAVA: Final = 17
# The JVMs this process started, so that they are waited for (and no Popen is dropped while
# its process runs).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class BrokerError(RuntimeError):
    """The local cluster could not be started or stopped; the message names the fix."""


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


class LocalKafka:
    """Start, stop, kill and restart the nodes of the local cluster by their pid files."""

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: BrokerSettings,
        *,
        brokers: int | None = None,
        network: BrokerNetwork | None = None,
    ) -> None:
        self._layout_file = settings.kafka_dir / "cluster.json"
        self.credentials_file = settings.kafka_dir / "credentials.json"
        self.client_env_file = settings.kafka_dir / "client.env"
        self.tls_dir = settings.kafka_dir / "tls"
        if network is None:  # an isolated cluster started before keeps its namespaces
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                network = Layout.from_json(self._layout_file.read_text()).network
        if network is not None and all(
            network.contains(s.rpartition(":")[0]) for s in kafka.servers
        ):
            pass  # the isolated cluster's own addresses
        elif not kafka.is_loopback:
            raise BrokerError(
                f"KAFKA_BOOTSTRAP_SERVERS={kafka.bootstrap_servers} is not a loopback address; "
                "the local cluster only serves this machine. Use that cluster as it is."
            )
        if brokers not in (None, 1, 3):
            raise BrokerError(f"the local cluster has 1 or 3 brokers, not {brokers}")
        self.kafka = kafka
        self.settings = settings
        host, _, port = kafka.servers[0].rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.brokers = brokers
        self.network = network
        if network is not None and brokers not in (None, network.brokers):
            raise BrokerError(f"the isolated cluster has {network.brokers} brokers")

    # -- layout --------------------------------------------------------------------------------

    def existing_layout(self) -> Layout | None:
        try:
            return Layout.from_json(self._layout_file.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise BrokerError(
                f"{self._layout_file} is damaged ({exc}); remove {self.settings.kafka_dir} "
                "(`ctr kafka down --delete-data`) to start an empty cluster"
            ) from None

    def layout(self) -> Layout:
        """The recorded layout, or a new one for ``brokers`` (default 1) brokers."""
        existing = self.existing_layout()
        if existing is not None:
            if self.brokers is not None and len(existing.brokers) != self.brokers:
                raise BrokerError(
                    f"{self.settings.kafka_dir} holds a {len(existing.brokers)}-broker cluster, "
                    f"not {self.brokers}: `ctr kafka down --delete-data` first (its records go), "
                    "or use another RUN_DIR"
                )
            self._check_auth(existing)
            return existing
        auth = None if self.settings.local_auth in (None, "none") else self.settings.local_auth
        tls = self._wanted_tls(auth, False)
        if self.network is not None:
            controller = self.settings.controller_port or self.port + 100
            return Layout.create_isolated(self.network, self.port, controller, auth=auth, tls=tls)
        count = self.brokers or 1
        if len(self.kafka.servers) == count:
            ports = [int(s.rpartition(":")[2]) for s in self.kafka.servers]
        else:
            ports = [self.port + i for i in range(count)]
        controller = self.settings.controller_port or ports[0] + 100
        return Layout.create(self.host, ports, controller, auth=auth, tls=tls)

    def _check_auth(self, layout: Layout) -> None:
        """The authentication asked for (``local_auth``) is the cluster's, or one it can be
        switched to (:meth:`_switch_auth`): none and SCRAM either way, not one SCRAM mechanism
        for the other."""
        asked = self.settings.local_auth
        if asked in (None, "none") or layout.auth in (None, asked):
            return
        raise BrokerError(
            f"the cluster under {self.settings.kafka_dir} requires {layout.auth} logins, not "
            f"{asked} (KAFKA_LOCAL_AUTH / --auth): its users were created for {layout.auth}; "
            "`ctr kafka down --delete-data` first (its records go), or use another RUN_DIR"
        )

    def _wanted_auth(self, layout: Layout) -> str | None:
        """The mechanism the cluster should require from this start on (None: no logins)."""
        asked = self.settings.local_auth
        if asked is None:
            return layout.auth
        return None if asked == "none" else asked

    def _wanted_tls(self, auth: str | None, current: bool) -> bool:
        """Whether the listener should be SASL_SSL from this start on (``local_tls``, else as
        it is; never without logins)."""
        asked = self.settings.local_tls
        if asked and auth is None:
            raise BrokerError(
                "TLS on the local cluster (KAFKA_LOCAL_TLS / --tls) comes with SCRAM logins: "
                "add --auth scram (KAFKA_LOCAL_AUTH=scram)"
            )
        return bool(current if asked is None else asked) and auth is not None

    def _switch_auth(self, layout: Layout, wanted: str | None, tls: bool) -> Layout:
        """The stopped cluster ``layout``, switched to require ``wanted`` logins (or none),
        over TLS or not, from its next start. Adding SCRAM to a cluster formatted without it:
        it is started once as it was, on its own addresses, its users are created through the
        Admin API (into the metadata log, which every restart replays), and it is stopped
        again. TLS on or off is the listener's configuration alone."""
        running = [n.node_id for n in layout.nodes if self._running_pid(n) is not None]
        if running:
            has = f"requires {layout.auth} logins" if layout.auth else "has no authentication"
            has += " over TLS" if layout.tls else ""
            wants = (wanted or "none") + (" over TLS" if tls else "")
            raise BrokerError(
                f"the running cluster under {self.settings.kafka_dir} {has}; to switch it to "
                f"{wants}, stop it first (`ctr kafka down`: its data stays)"
            )
        if wanted is not None and layout.auth is None:
            as_it_was = LocalKafka(
                self.kafka.model_copy(update=_NO_LOGIN),
                self.settings.model_copy(update={"local_auth": "none", "local_tls": False}),
                network=layout.network,
            )
            as_it_was.start()
            try:
                credentials = load_or_create_credentials(self.credentials_file, wanted)
                _create_users(as_it_was.client_settings(layout), credentials)
            except CredentialsError as exc:
                raise BrokerError(str(exc)) from None
            finally:
                as_it_was.stop()
        switched = dataclasses.replace(layout, auth=wanted, tls=tls)
        self._layout_file.write_text(switched.to_json())
        return switched

    def credentials(self, layout: Layout | None = None) -> Credentials | None:
        """The SCRAM users of the cluster (None without authentication)."""
        layout = layout or self.existing_layout()
        if layout is None or layout.auth is None:
            return None
        try:
            credentials = load_credentials(self.credentials_file)
            if layout.tls:
                credentials = dataclasses.replace(credentials, tls=load_tls(self.tls_dir))
        except CredentialsError as exc:
            raise BrokerError(str(exc)) from None
        return credentials

    def client_settings(self, layout: Layout | None = None) -> KafkaSettings:
        """Settings for the cluster's clients: its brokers' addresses and, with authentication
        on, its client user's credentials (``self.kafka`` as it is if nothing is recorded)."""
        layout = layout or self.existing_layout()
        if layout is None:
            return self.kafka
        kafka = self.kafka.model_copy(update={"bootstrap_servers": layout.bootstrap_servers})
        credentials = self.credentials(layout)
        return credentials.client_settings(kafka) if credentials else kafka

    def node_dir(self, node: Node) -> Path:
        return self.settings.kafka_dir / f"node-{node.node_id}"

    def log_file(self, node: Node) -> Path:
        return self.node_dir(node) / "server.log"

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> ClusterState:
        layout = self.existing_layout()
        if layout is None:
            return ClusterState(self.kafka.bootstrap_servers, {}, started_by_us=False)
        pids = {n.node_id: self._running_pid(n) for n in layout.nodes}
        return ClusterState(layout.bootstrap_servers, pids, started_by_us=True)

    def _running_pid(self, node: Node) -> int | None:
        pid = read_pid(self.node_dir(node) / "kafka.pid")
        config = str(self.node_dir(node) / "server.properties")
        return pid if pid is not None and _is_node(pid, config) else None

    # -- start ---------------------------------------------------------------------------------

    def start(self, *, nodes: Collection[int] | None = None) -> ClusterState:
        """Start every node not running yet (or only those of ``nodes``) and wait until every
        running broker answers."""
        layout = self.layout()
        wanted = self._wanted_auth(layout)
        tls = self._wanted_tls(wanted, layout.tls)
        if (wanted, tls) != (layout.auth, layout.tls):
            layout = self._switch_auth(layout, wanted, tls)
        credentials = self._credentials_for_start(layout)
        if credentials is not None:  # from now on this object's clients log in
            self.kafka = credentials.client_settings(self.kafka)
        current = {n.node_id: self._running_pid(n) for n in layout.nodes}
        missing = [
            n
            for n in layout.nodes
            if current[n.node_id] is None and (nodes is None or n.node_id in nodes)
        ]
        if not missing:
            self.wait_ready(layout, self._expected(layout, current))
            return ClusterState(layout.bootstrap_servers, current, started_by_us=True)
        if len(missing) == len(layout.nodes) and self.existing_layout() is None:
            foreign = self._foreign_kafka(layout)
            if foreign is not None:
                return foreign
        java = check_java(self.settings.java)
        try:
            classpath = f"{jar_dir('kafka')}/*"
        except JarsMissingError as exc:
            raise BrokerError(str(exc)) from None
        if layout.network is not None:  # first: the controller's address is the bridge's
            try:
                layout.network.create()
            except NetnsError as exc:
                raise BrokerError(str(exc)) from None
        _check_ports(missing)
        self.settings.kafka_dir.mkdir(parents=True, exist_ok=True)
        self._layout_file.write_text(layout.to_json())
        if credentials is not None:
            clients = self.client_settings(layout)
            write_client_env(self.client_env_file, clients)
            write_client_properties(self.settings.kafka_dir / "client.properties", clients)
        for node in missing:
            self._write_config(layout, node, credentials)
        with ThreadPoolExecutor(len(missing)) as pool:
            list(pool.map(lambda n: self._format(layout, n, java, classpath, credentials), missing))
        for node in missing:
            current[node.node_id] = self._spawn(layout, node, java, classpath)
        self.wait_ready(layout, self._expected(layout, current))
        return ClusterState(layout.bootstrap_servers, current, started_by_us=True)

    def _credentials_for_start(self, layout: Layout) -> Credentials | None:
        """The cluster's credentials: those recorded, or for a cluster not formatted yet, new
        ones (kept in ``credentials.json``, owner-only, with the cluster's directory)."""
        if layout.auth is None:
            return None
        self.settings.kafka_dir.mkdir(parents=True, exist_ok=True)
        self.settings.kafka_dir.chmod(0o700)
        try:
            if self.existing_layout() is not None:
                credentials = load_credentials(self.credentials_file)
            else:
                credentials = load_or_create_credentials(self.credentials_file, layout.auth)
            if layout.tls:  # the brokers' certificate: made once, valid for their addresses
                hosts = [n.host for n in layout.brokers]
                files = ensure_tls(self.tls_dir, hosts, self.settings.java)
                credentials = dataclasses.replace(credentials, tls=files)
        except CredentialsError as exc:
            raise BrokerError(str(exc)) from None
        return credentials

    @staticmethod
    def _expected(layout: Layout, pids: dict[int, int | None]) -> set[int]:
        return {n.node_id for n in layout.brokers if pids[n.node_id] is not None}

    def _foreign_kafka(self, layout: Layout) -> ClusterState | None:
        """Something (a Kafka we did not start) already answers on the bootstrap address."""
        with contextlib.suppress(KafkaUnavailableError):
            _metadata(self.kafka, timeout_s=0.5)
            return ClusterState(self.kafka.bootstrap_servers, {}, started_by_us=False)
        return None

    def _write_config(self, layout: Layout, node: Node, credentials: Credentials | None) -> None:
        directory = self.node_dir(node)
        (directory / "data").mkdir(parents=True, exist_ok=True)
        config = node_properties(layout, node, directory, credentials)
        if credentials is None:
            (directory / "server.properties").write_text(config)
        else:  # it holds the brokers' password
            write_private(directory / "server.properties", config)

    def _format(
        self,
        layout: Layout,
        node: Node,
        java: str,
        classpath: str,
        credentials: Credentials | None,
    ) -> None:
        data = self.node_dir(node) / "data"
        meta = data / "meta.properties"
        if meta.exists():
            found = _read_properties(meta)
            if found.get("cluster.id") != layout.cluster_id or found.get("node.id") != str(
                node.node_id
            ):
                raise BrokerError(
                    f"the log directory {data} belongs to another cluster or is damaged "
                    f"(meta.properties: cluster.id={found.get('cluster.id')}, "
                    f"node.id={found.get('node.id')}; expected {layout.cluster_id}, "
                    f"{node.node_id}): move it away, or `ctr kafka down --delete-data` to "
                    "start an empty cluster"
                )
            return
        if any(data.iterdir()):
            raise BrokerError(
                f"the log directory {data} holds files but no meta.properties: it is damaged "
                "or not Kafka's; move it away, or `ctr kafka down --delete-data` to start an "
                "empty cluster"
            )
        arguments = [
            "-cp",
            classpath,
            STORAGE_TOOL,
            "format",
            f"--cluster-id={layout.cluster_id}",
            "--config",
            str(self.node_dir(node) / "server.properties"),
        ]
        # The SCRAM users' passwords go through an owner-only argument file (java @file), not
        # the command line, which every local user can read in /proc.
        argfile = self.node_dir(node) / ".format-arguments"
        if credentials is not None:
            write_private(
                argfile,
                "".join(_argfile_line(a) for a in [*arguments, *credentials.scram_arguments()]),
            )
            arguments = [f"@{argfile}"]
        try:
            done = subprocess.run(
                [java, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", *arguments],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
        finally:
            argfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise BrokerError(
                f"formatting the log directory of Kafka node {node.node_id} failed: "
                f"{_first_error(done.stdout + done.stderr)}"
            )

    def _spawn(self, layout: Layout, node: Node, java: str, classpath: str) -> int:
        directory = self.node_dir(node)
        command = [
            java,
            # The heap fixed at its maximum and touched at start (Kafka's own scripts set
            # -Xms to -Xmx): memory flat from the first minute, so a soak tells a leak from a
            # heap still filling up (with -Xms64m the RSS rose ~190 MB/h for hours).
            f"-Xmx{self.settings.heap}",
            f"-Xms{self.settings.heap}",
            "-XX:+AlwaysPreTouch",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            classpath,
            KAFKA_MAIN,
            str(directory / "server.properties"),
        ]
        if layout.network is not None and node.netns is not None:
            command = layout.network.wrap(node.node_id, command)
        with self.log_file(node).open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the shell that started it must not stop it
            )
        _CHILDREN[process.pid] = process
        (directory / "kafka.pid").write_text(f"{process.pid}\n")
        return process.pid

    def wait_ready(self, layout: Layout, brokers: set[int]) -> None:
        """Wait until the nodes started are alive and the ``brokers`` are registered."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        wanted = brokers
        last = "no answer"
        while True:
            for node in layout.nodes:
                if node.is_broker and node.node_id not in brokers:
                    continue
                pid = read_pid(self.node_dir(node) / "kafka.pid")
                if pid is None or not is_alive(pid):
                    _reap(pid)
                    raise BrokerError(
                        f"Kafka node {node.node_id} exited during start-up: "
                        f"{_first_error(_tail(self.log_file(node), 200))} "
                        f"(log: {self.log_file(node)})"
                    )
            try:
                brokers = set(_metadata(self.client_settings(layout), timeout_s=1.0).brokers)
                if wanted <= brokers:
                    return
                last = f"brokers {sorted(brokers)} of {sorted(wanted)} registered"
            except KafkaUnavailableError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the local Kafka cluster did not come up within "
                    f"{self.settings.start_timeout_s:g} s ({last}); logs under "
                    f"{self.settings.kafka_dir}"
                )
            time.sleep(0.2)

    # -- stop, kill ----------------------------------------------------------------------------

    def stop(self, *, timeout_s: float = 30.0, delete_data: bool = False) -> bool:
        """Stop every node (brokers first: a controlled shutdown needs the controller).
        False if none was running. ``delete_data`` also removes every record."""
        layout = self.existing_layout()
        stopped = False
        if layout is not None:
            order = sorted(layout.nodes, key=lambda n: not n.is_broker)
            brokers = [n for n in order if n.is_broker]
            controllers = [n for n in order if not n.is_broker]
            for group in (brokers, controllers):
                pids = [pid for n in group if (pid := self._running_pid(n)) is not None]
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)
                _wait_gone(pids, timeout_s)
                stopped = stopped or bool(pids)
                for node in group:
                    (self.node_dir(node) / "kafka.pid").unlink(missing_ok=True)
        if delete_data:
            shutil.rmtree(self.settings.kafka_dir, ignore_errors=True)
            if layout is not None and layout.network is not None:
                layout.network.destroy()
        return stopped

    def kill(self, node_id: int) -> int:
        """SIGKILL one node (fault tests); returns its pid."""
        node = self.layout().node(node_id)
        pid = self._running_pid(node)
        if pid is None:
            raise BrokerError(f"Kafka node {node_id} is not running")
        os.kill(pid, signal.SIGKILL)
        _wait_gone([pid], 10.0)
        return pid

    def stop_node(self, node_id: int, *, timeout_s: float = 30.0) -> None:
        """SIGTERM one node and wait for it (a controlled shutdown for a broker)."""
        node = self.layout().node(node_id)
        pid = self._running_pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            _wait_gone([pid], timeout_s)


def _check_ports(nodes: list[Node]) -> None:
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


def node_properties(
    layout: Layout, node: Node, directory: Path, credentials: Credentials | None = None
) -> str:
    """The node's server.properties: with ``credentials``, a SASL_PLAINTEXT (SASL_SSL with
    their TLS files) listener that takes SCRAM logins only, which the brokers also use between
    themselves."""
    replicas = min(3, len(layout.brokers))
    controller = layout.controller
    voters = f"{controller.node_id}@{controller.host}:{controller.controller_port}"
    listener = "PLAINTEXT" if credentials is None else credentials.listener
    listeners = []
    if node.broker_port is not None:
        listeners.append(f"{listener}://{node.host}:{node.broker_port}")
    if "controller" in node.roles:
        listeners.append(f"CONTROLLER://{node.host}:{node.controller_port}")
    lines = {
        "process.roles": node.roles,
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(listeners),
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
        "log.dirs": directory / "data",
        "num.partitions": 1,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 6,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min(2, replicas),
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min(2, replicas),
        "group.initial.rebalance.delay.ms": 0,
        "unclean.leader.election.enable": "false",
        # A broker that stops heartbeating is fenced after this long: the time a SIGKILLed
        # leader's partitions wait for a new leader (default 9 s).
        "broker.session.timeout.ms": 4000,
        "broker.heartbeat.interval.ms": 500,
        "replica.lag.time.max.ms": 10000,
        # Segments past the topics' retention go within a minute (default 5): a size bound
        # (KAFKA_TOPIC_CONFIG) holds closely.
        "log.retention.check.interval.ms": 60000,
    }
    if node.is_broker:
        lines["advertised.listeners"] = f"{listener}://{node.host}:{node.broker_port}"
        lines["inter.broker.listener.name"] = listener
        if credentials is not None:
            mechanism = credentials.mechanism
            lines["sasl.enabled.mechanisms"] = mechanism
            lines["sasl.mechanism.inter.broker.protocol"] = mechanism
            jaas = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
            lines[jaas] = _properties_value(credentials.broker_jaas())
        if credentials is not None and credentials.tls is not None:
            tls = credentials.tls
            lines["ssl.keystore.type"] = "PKCS12"
            lines["ssl.keystore.location"] = _properties_value(str(tls.keystore))
            lines["ssl.keystore.password"] = tls.password
            lines["ssl.key.password"] = tls.password
            # What a broker trusts when it connects to the others (they share the certificate).
            lines["ssl.truststore.type"] = "PEM"
            lines["ssl.truststore.location"] = _properties_value(str(tls.ca))
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def _properties_value(value: str) -> str:
    """``value`` as a Java properties file reads it back (backslashes are escapes there)."""
    return value.replace("\\", "\\\\")


def _argfile_line(argument: str) -> str:
    """One argument of a java @argfile: quoted, with backslashes and quotes escaped."""
    escaped = argument.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"\n'


def check_java(java: str) -> str:
    """``java`` if it runs and is at least Java 17; :class:`BrokerError` naming the fix."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        raise BrokerError(
            f"Java is not installed ({java!r} not found): Apache Kafka needs Java {MIN_JAVA}+; "
            "Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
        ) from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))  # "1.8" is Java 8
    if major < MIN_JAVA:
        raise BrokerError(
            f"Apache Kafka needs Java {MIN_JAVA} or newer; {java} is "
            f"{major or 'of unknown version'}: install openjdk-17-jre-headless and put it first "
            "on PATH, or set JAVA_HOME"
        )
    return java


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


_NO_LOGIN: Final = {
    "security_protocol": "PLAINTEXT",
    "sasl_username": None,
    "sasl_password": None,
}


def _create_users(kafka: KafkaSettings, credentials: Credentials) -> None:
    """The SCRAM users of ``credentials``, created through the Admin API of a running cluster."""
    mechanism = {
        "SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
        "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512,
    }[credentials.mechanism]
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            user.username, ScramCredentialInfo(mechanism, 8192), user.password.encode()
        )
        for user in (credentials.broker, credentials.client)
    ]
    admin = admin_client(kafka)
    try:
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(timeout=60)
    except KafkaException as exc:
        raise BrokerError(f"creating the cluster's SCRAM users failed: {exc}") from None


def _metadata(settings: KafkaSettings, *, timeout_s: float) -> ClusterMetadata:
    admin = admin_client(settings, **{"socket.connection.setup.timeout.ms": 1000})
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailableError(str(exc.args[0]) if exc.args else str(exc)) from None


def _read_properties(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _is_node(pid: int, config: str) -> bool:
    """True if ``pid`` is a live Kafka JVM run with ``config``: pid files can go stale."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_alive(pid) and KAFKA_MAIN.encode() in cmdline and config.encode() in cmdline


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while is_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int | None) -> None:
    if pid is None:
        return
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _CHILDREN[pid]
        return
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(pid, os.WNOHANG)


def _first_error(log: str) -> str:
    """The first line of a JVM log that says what went wrong."""
    for line in log.splitlines():
        if re.search(r"\b(ERROR|FATAL)\b|Exception|Error:", line):
            return line.strip()[:400]
    lines = [line for line in log.splitlines() if line.strip()]
    return lines[-1].strip()[:400] if lines else "(no output)"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
