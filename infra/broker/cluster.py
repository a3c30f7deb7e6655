"""The local cluster as one object: its layout chosen and recorded, its nodes started,
stopped and killed, its logins switched and its ACLs granted, its clients' settings."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Final

from infra.broker.acls import apply_grants, platform_grants
from infra.broker.errors import BrokerError
from infra.broker.health import answers, wait_ready
from infra.broker.layout import ClusterState, Layout, Node
from infra.broker.logins import Logins
from infra.broker.node import Nodes
from infra.broker.ports import check_ports
from infra.broker.processes import check_java
from infra.broker_auth import Credentials, Role
from infra.broker_settings import BrokerSettings
from infra.netns import BrokerNetwork, NetnsError
from runtime.jars import JarsMissingError, jar_dir
from runtime.kafka_settings import KafkaSettings

# The client settings of a cluster without logins (to reach one before it is switched to SCRAM).
_NO_LOGIN: Final = {
    "security_protocol": "PLAINTEXT",
    "sasl_username": None,
    "sasl_password": None,
}


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
        self.client_env_file = settings.kafka_dir / "client.env"
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
        self.nodes = Nodes(settings)
        self.logins = Logins(settings)

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
            self.logins.check(existing)
            return existing
        auth = None if self.settings.local_auth in (None, "none") else self.settings.local_auth
        tls = self.logins.wanted_tls(auth, False)
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

    def credentials(self, layout: Layout | None = None) -> Credentials | None:
        """The SCRAM users of the cluster (None without authentication)."""
        return self.logins.credentials(layout or self.existing_layout())

    def client_settings(self, layout: Layout | None = None, role: Role = "admin") -> KafkaSettings:
        """Settings for the cluster's clients: its brokers' addresses and, with authentication
        on, the login of ``role`` (the admin's by default; ``self.kafka`` as it is if nothing
        is recorded)."""
        layout = layout or self.existing_layout()
        if layout is None:
            return self.kafka
        kafka = self.kafka.model_copy(update={"bootstrap_servers": layout.bootstrap_servers})
        credentials = self.credentials(layout)
        return credentials.client_settings(kafka, role) if credentials else kafka

    def node_dir(self, node: Node) -> Path:
        return self.nodes.directory(node)

    def state(self) -> ClusterState:
        layout = self.existing_layout()
        if layout is None:
            return ClusterState(self.kafka.bootstrap_servers, {}, started_by_us=False)
        pids = {n.node_id: self.nodes.running_pid(n) for n in layout.nodes}
        return ClusterState(layout.bootstrap_servers, pids, started_by_us=True)

    # -- start ---------------------------------------------------------------------------------

    def start(self, *, nodes: Collection[int] | None = None) -> ClusterState:
        """Start every node not running yet (or only those of ``nodes``), wait until every
        running broker answers, and (with logins) grant the roles their ACLs."""
        layout = self.layout()
        wanted = self.logins.wanted_auth(layout)
        tls = self.logins.wanted_tls(wanted, layout.tls)
        if (wanted, tls) != (layout.auth, layout.tls):
            layout = self._switch_auth(layout, wanted, tls)
        credentials = self.logins.for_start(layout, formatted=self.existing_layout() is not None)
        if credentials is not None:  # from now on this object's clients log in
            self.kafka = credentials.client_settings(self.kafka)
        current = {n.node_id: self.nodes.running_pid(n) for n in layout.nodes}
        missing = [
            n
            for n in layout.nodes
            if current[n.node_id] is None and (nodes is None or n.node_id in nodes)
        ]
        if (
            missing
            and len(missing) == len(layout.nodes)
            and self.existing_layout() is None
            and answers(self.kafka)
        ):  # something (a Kafka we did not start) already answers on the bootstrap address
            return ClusterState(self.kafka.bootstrap_servers, {}, started_by_us=False)
        if missing:
            current.update(self._launch(layout, missing, credentials))
        self._wait_ready(layout, current)
        if credentials is not None:
            self._grant(layout, credentials)
        return ClusterState(layout.bootstrap_servers, current, started_by_us=True)

    def _launch(
        self, layout: Layout, missing: list[Node], credentials: Credentials | None
    ) -> dict[int, int]:
        """Start the ``missing`` nodes (the cluster's namespaces first, if isolated), the
        layout recorded; their pids by node id."""
        java = check_java(self.settings.java)
        try:
            classpath = f"{jar_dir('kafka', self.settings.jar_cache)}/*"
        except JarsMissingError as exc:
            raise BrokerError(str(exc)) from None
        if layout.network is not None:  # first: the controller's address is the bridge's
            try:
                layout.network.create()
            except NetnsError as exc:
                raise BrokerError(str(exc)) from None
        check_ports(missing)
        self.settings.kafka_dir.mkdir(parents=True, exist_ok=True)
        self._layout_file.write_text(layout.to_json())
        return self.nodes.launch(layout, missing, java, classpath, credentials)

    def _grant(self, layout: Layout, credentials: Credentials) -> None:
        """On the running cluster: every role's user (those its credentials file gained since
        it was formatted created now), the roles' ACLs on ``self.kafka``'s topics (idempotent),
        and the roles' env files."""
        admin = self.client_settings(layout)
        self.logins.complete_users(admin, credentials)
        # A node just restarted on a busy machine: its controller may take a while to answer.
        apply_grants(admin, credentials, platform_grants(self.kafka), timeout_s=120.0)
        self.logins.write_client_files(admin, credentials)

    def _wait_ready(self, layout: Layout, pids: dict[int, int | None]) -> None:
        """Wait until the nodes with a pid are alive and their brokers registered."""
        expected = {n.node_id for n in layout.brokers if pids[n.node_id] is not None}
        wait_ready(self.nodes, layout, expected, self.client_settings(layout))

    def _switch_auth(self, layout: Layout, wanted: str | None, tls: bool) -> Layout:
        """The stopped cluster ``layout``, switched to require ``wanted`` logins (or none),
        over TLS or not, from its next start. Adding SCRAM to a cluster formatted without it:
        it is started once as it was, on its own addresses, its users are created through the
        Admin API (into the metadata log, which every restart replays), and it is stopped
        again. TLS on or off is the listener's configuration alone."""
        running = [n.node_id for n in layout.nodes if self.nodes.running_pid(n) is not None]
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
                self.logins.create_users(as_it_was.client_settings(layout), wanted)
            finally:
                as_it_was.stop()
        switched = dataclasses.replace(layout, auth=wanted, tls=tls)
        self._layout_file.write_text(switched.to_json())
        return switched

    # -- stop, kill ----------------------------------------------------------------------------

    def stop(self, *, timeout_s: float = 30.0, delete_data: bool = False) -> bool:
        """Stop every node (brokers first: a controlled shutdown needs the controller).
        False if none was running. ``delete_data`` also removes every record."""
        layout = self.existing_layout()
        stopped = layout is not None and self.nodes.stop_all(layout, timeout_s)
        if delete_data:
            shutil.rmtree(self.settings.kafka_dir, ignore_errors=True)
            if layout is not None and layout.network is not None:
                layout.network.destroy()
        return stopped

    def kill(self, node_id: int) -> int:
        """SIGKILL one node (fault tests); returns its pid."""
        return self.nodes.kill(self.layout().node(node_id))

    def stop_node(self, node_id: int, *, timeout_s: float = 30.0) -> None:
        """SIGTERM one node and wait for it (a controlled shutdown for a broker)."""
        self.nodes.stop(self.layout().node(node_id), timeout_s)
