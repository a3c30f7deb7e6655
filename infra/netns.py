"""Network namespaces for the local Kafka brokers, so that one can be cut off from the others
and from the clients (a partition, not a crash), then healed.

Each broker node N runs in its own namespace ``<prefix>-N`` behind a veth pair: ``eth0`` inside
(``10.<net>.0.N/24``), ``<prefix>-N`` outside, attached to a bridge ``<prefix>-br``
(``10.<net>.0.254``) in the machine's own namespace, where the controller and every client run.
Cutting a broker off is taking its outside link down: it reaches neither the controller, nor
the other brokers, nor any client, and nobody reaches it; healing is bringing the link up.

Needs root (CAP_NET_ADMIN) and ``ip`` (iproute2). Nothing here leaves the machine: the bridge
has no uplink and no route goes anywhere but the subnet.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass

from infra.errors import InfraError

CONTROLLER_HOST_OCTET = 254


class NetnsError(InfraError, RuntimeError):
    """The namespaces could not be set up; the message names the fix."""


@dataclass(frozen=True)
class BrokerNetwork:
    """The namespaces, links and addresses of the brokers ``1..brokers``."""

    prefix: str = "ctrk"
    net: int = 77  # the subnet is 10.<net>.0.0/24
    brokers: int = 3

    def __post_init__(self) -> None:
        if not (self.prefix.isalnum() and 1 <= len(self.prefix) <= 8):
            raise ValueError(f"prefix {self.prefix!r}: 1-8 letters or digits")
        if not 0 <= self.net <= 255:
            raise ValueError(f"net {self.net}: 0-255")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def gateway(self) -> str:
        """The bridge's address, in the machine's namespace: the controller listens there."""
        return self.host(CONTROLLER_HOST_OCTET)

    def host(self, octet: int) -> str:
        return str(ipaddress.IPv4Address(f"10.{self.net}.0.{octet}"))

    def namespace(self, node_id: int) -> str:
        return f"{self.prefix}-{node_id}"

    def link(self, node_id: int) -> str:
        """The outside end of the broker's veth pair (what a partition takes down)."""
        return f"{self.prefix}-{node_id}"

    def contains(self, host: str) -> bool:
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return address in ipaddress.IPv4Network(f"10.{self.net}.0.0/24")

    # -- set up, tear down ---------------------------------------------------------------------

    def exists(self) -> bool:
        return _run("ip", "link", "show", self.bridge, check=False).returncode == 0

    def create(self) -> None:
        """The bridge and a namespace per broker (idempotent)."""
        _check_privileges()
        if not self.exists():
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        namespaces = set(_run("ip", "netns", "list").stdout.split())
        for node in range(1, self.brokers + 1):
            ns, link = self.namespace(node), self.link(node)
            if ns not in namespaces:
                _run("ip", "netns", "add", ns)
            if _run("ip", "link", "show", link, check=False).returncode != 0:
                _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "link", "set", link, "master", self.bridge)
                _run("ip", "-n", ns, "addr", "add", f"{self.host(node)}/24", "dev", "eth0")
            _run("ip", "link", "set", link, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")

    def destroy(self) -> None:
        """Remove the namespaces and the bridge (their processes should be gone first)."""
        for node in range(1, self.brokers + 1):
            _run("ip", "link", "del", self.link(node), check=False)
            _run("ip", "netns", "del", self.namespace(node), check=False)
        _run("ip", "link", "del", self.bridge, check=False)

    # -- faults --------------------------------------------------------------------------------

    def partition(self, node_id: int) -> None:
        """Cut broker ``node_id`` off from everyone (its process runs on)."""
        _run("ip", "link", "set", self.link(node_id), "down")

    def heal(self, node_id: int) -> None:
        _run("ip", "link", "set", self.link(node_id), "up")

    def is_partitioned(self, node_id: int) -> bool:
        shown = _run("ip", "-o", "link", "show", self.link(node_id)).stdout
        return "state UP" not in shown and ",UP" not in shown

    def wrap(self, node_id: int, command: list[str]) -> list[str]:
        """``command`` run inside broker ``node_id``'s namespace (``ip netns exec`` execs it:
        the pid is the command's)."""
        return ["ip", "netns", "exec", self.namespace(node_id), *command]


def _check_privileges() -> None:
    if shutil.which("ip") is None:
        raise NetnsError("`ip` (iproute2) is not installed: apt-get install iproute2")
    if os.geteuid() != 0:
        raise NetnsError(
            "network namespaces need root (CAP_NET_ADMIN); run as root, or use the brokers "
            "on loopback (KAFKA_NETNS unset)"
        )


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout}")
    return done
