"""The nodes of the local cluster on disk and as JVMs: each node's directory under
``RUN_DIR/kafka/node-N`` (``server.properties``, ``server.log``, ``kafka.pid``, ``data/``), its
log directory formatted once, its JVM started, signalled and waited for."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from infra.broker.errors import BrokerError
from infra.broker.layout import Layout, Node
from infra.broker.processes import first_error, is_alive, read_pid, track, wait_gone
from infra.broker.properties import node_properties, read_properties
from infra.broker_auth import Credentials, write_private
from infra.broker_settings import BrokerSettings
from runtime.jars import INFRA

KAFKA_MAIN: Final = "kafka.Kafka"
STORAGE_TOOL: Final = "kafka.tools.StorageTool"
LOG4J_CONFIG: Final = INFRA / "kafka" / "log4j2.properties"


class Nodes:
    """The nodes' files and JVMs, found by their pid files."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings

    def directory(self, node: Node) -> Path:
        return self.settings.kafka_dir / f"node-{node.node_id}"

    def log_file(self, node: Node) -> Path:
        return self.directory(node) / "server.log"

    def pid_file(self, node: Node) -> Path:
        return self.directory(node) / "kafka.pid"

    def running_pid(self, node: Node) -> int | None:
        pid = read_pid(self.pid_file(node))
        config = str(self.directory(node) / "server.properties")
        return pid if pid is not None and _is_node(pid, config) else None

    # -- start ---------------------------------------------------------------------------------

    def launch(
        self,
        layout: Layout,
        nodes: Collection[Node],
        java: str,
        classpath: str,
        credentials: Credentials | None,
    ) -> dict[int, int]:
        """Configure, format (in parallel: each is a JVM start) and start ``nodes``; their
        pids by node id."""
        for node in nodes:
            self.write_config(layout, node, credentials)
        with ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(lambda n: self.format(layout, n, java, classpath, credentials), nodes))
        return {node.node_id: self.spawn(layout, node, java, classpath) for node in nodes}

    def write_config(self, layout: Layout, node: Node, credentials: Credentials | None) -> None:
        directory = self.directory(node)
        (directory / "data").mkdir(parents=True, exist_ok=True)
        config = node_properties(layout, node, directory, credentials)
        if credentials is None:
            (directory / "server.properties").write_text(config)
        else:  # it holds the brokers' password
            write_private(directory / "server.properties", config)

    def format(
        self,
        layout: Layout,
        node: Node,
        java: str,
        classpath: str,
        credentials: Credentials | None,
    ) -> None:
        data = self.directory(node) / "data"
        meta = data / "meta.properties"
        if meta.exists():
            found = read_properties(meta)
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
            str(self.directory(node) / "server.properties"),
        ]
        # The SCRAM users' passwords go through an owner-only argument file (java @file), not
        # the command line, which every local user can read in /proc.
        argfile = self.directory(node) / ".format-arguments"
        if credentials is not None:
            write_private(
                argfile,
                "".join(_argfile_line(a) for a in [*arguments, *credentials.scram_arguments()]),
            )
            arguments = [f"@{argfile}"]
        try:
            done = subprocess.run(
                [
                    java,
                    f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                    *self.settings.jvm_arguments(),
                    *arguments,
                ],
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
                f"{first_error(done.stdout + done.stderr)}"
            )

    def spawn(self, layout: Layout, node: Node, java: str, classpath: str) -> int:
        directory = self.directory(node)
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
            *self.settings.jvm_arguments(),
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
        track(process)
        self.pid_file(node).write_text(f"{process.pid}\n")
        return process.pid

    # -- stop, kill ----------------------------------------------------------------------------

    def stop_all(self, layout: Layout, timeout_s: float) -> bool:
        """Stop every node (brokers first: a controlled shutdown needs the controller).
        False if none was running."""
        stopped = False
        order = sorted(layout.nodes, key=lambda n: not n.is_broker)
        brokers = [n for n in order if n.is_broker]
        controllers = [n for n in order if not n.is_broker]
        for group in (brokers, controllers):
            pids = [pid for n in group if (pid := self.running_pid(n)) is not None]
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
            wait_gone(pids, timeout_s)
            stopped = stopped or bool(pids)
            for node in group:
                self.pid_file(node).unlink(missing_ok=True)
        return stopped

    def kill(self, node: Node) -> int:
        """SIGKILL ``node`` (fault tests); returns its pid."""
        pid = self.running_pid(node)
        if pid is None:
            raise BrokerError(f"Kafka node {node.node_id} is not running")
        os.kill(pid, signal.SIGKILL)
        wait_gone([pid], 10.0)
        return pid

    def stop(self, node: Node, timeout_s: float) -> None:
        """SIGTERM ``node`` and wait for it (a controlled shutdown for a broker)."""
        pid = self.running_pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            wait_gone([pid], timeout_s)


def _is_node(pid: int, config: str) -> bool:
    """True if ``pid`` is a live Kafka JVM run with ``config``: pid files can go stale."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_alive(pid) and KAFKA_MAIN.encode() in cmdline and config.encode() in cmdline


def _argfile_line(argument: str) -> str:
    """One argument of a java @argfile: quoted, with backslashes and quotes escaped."""
    escaped = argument.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"\n'
