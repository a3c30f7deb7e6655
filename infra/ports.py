"""Free TCP ports for the local servers tests and benchmarks start (brokers, S3, API servers,
Spark's master and workers), chosen where no outgoing connection can take them.

The kernel picks the port of ``bind(0)`` from its ephemeral range, the range it also takes the
local port of every outgoing connection from: between the pick and the server's own bind, any
client on the machine (a broker's replica fetcher, Spark, a test's producer: hundreds in a test
session) may take it as its source port, and the server then finds it taken. Ports below that
range are only ever taken by servers that ask for them, so the ports handed out here lie there,
each checked by binding it (which sees a port held by a connection, not only a listener) and
none handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

from infra.errors import InfraError

LOWEST = 10000
"""The lowest port handed out (below it: ports well-known services are configured on)."""

_HANDED_OUT: set[int] = set()
_RANDOM = random.SystemRandom()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, below the ephemeral range."""
    top = ephemeral_low()
    if top - LOWEST < 1000:
        raise InfraError(f"no room for local servers' ports below the ephemeral range (from {top})")
    for _ in range(200):
        port = _RANDOM.randrange(LOWEST, top)
        if claim([port]):
            return port
    raise InfraError(f"no free port between {LOWEST} and {top}")


def claim(ports: Iterable[int]) -> bool:
    """Hand out ``ports`` together if each is free now and none was handed out before."""
    wanted = list(ports)
    if any(port in _HANDED_OUT for port in wanted) or not all(map(bindable, wanted)):
        return False
    _HANDED_OUT.update(wanted)
    return True


def ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``port`` now (nothing listens on it, no connection holds it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True
