"""A load balancer in front of API replicas: HAProxy (Debian's package; `make test` and `make
bench` install it), its configuration written for the replicas, run as a child process.

:func:`haproxy_config` writes the configuration: requests go round robin to the replicas whose
readiness check (``GET /readyz``) answers 200; a request that could not reach one (refused, or
the connection closed without an answer) is sent to another; each request carries the client's
address in ``X-Forwarded-For`` (the replicas believe it from the balancer's address only:
``API_TRUSTED_PROXIES``); and the per-client connection cap that a replica cannot apply behind
a balancer (it counts connections before any header, and every connection is the balancer's) is
applied here, per source address, with the same 429. The balancer is the edge: an
``X-Forwarded-For`` a client sends is dropped, not passed on. :class:`Balancer` starts HAProxy
in the foreground (``-db``: not daemonised, a child process its caller stops), waits until it
listens, and reads each replica's state and request counts from its stats socket.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from infra.errors import InfraError

CHECK_PATH: Final = "/readyz"
# Where Debian puts it: /usr/sbin is not on every user's PATH.
_DEBIAN_BINARY: Final = Path("/usr/sbin/haproxy")
# A Unix socket's path is at most 107 bytes on Linux.
_MAX_SOCKET_PATH: Final = 107


class BalancerError(InfraError, RuntimeError):
    """HAProxy is missing, refused its configuration, or did not start."""


@dataclass(frozen=True)
class Replica:
    """One API replica the balancer sends requests to."""

    name: str
    host: str
    port: int


@dataclass(frozen=True)
class BalancerConfig:
    """What the generated configuration says.

    ``max_connections_per_client``: connections one source address may hold open at the
    balancer (more get a 429, as ``API_MAX_CONNECTIONS_PER_CLIENT`` would); ``replica_
    connections``: connections to one replica at most (requests past them queue at the
    balancer, ``queue_timeout_s``), to keep below each replica's ``API_MAX_CONNECTIONS``;
    ``check_interval_s``: seconds between two readiness checks of a replica (two failed ones
    take it out, one good one puts it back)."""

    port: int
    replicas: tuple[Replica, ...]
    host: str = "127.0.0.1"
    max_connections_per_client: int = 64
    replica_connections: int = 256
    check_interval_s: float = 1.0
    connect_timeout_s: float = 2.0
    # Longer than any answer: a replica stops its own queries at API_CTR_TIMEOUT_S and
    # API_SQL_TIMEOUT_S.
    answer_timeout_s: float = 60.0
    queue_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError("'replicas' must name at least one replica")
        names = [replica.name for replica in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"'replicas' must have distinct names, got {names}")
        for name in ("max_connections_per_client", "replica_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"'{name}' must be >= 1, got {getattr(self, name)}")
        for name in ("check_interval_s", "connect_timeout_s", "answer_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"'{name}' must be > 0, got {getattr(self, name)}")


def haproxy_config(config: BalancerConfig, *, stats_socket: Path | None = None) -> str:
    """HAProxy's configuration for ``config`` (HAProxy 2.6, Debian 12's); with
    ``stats_socket``, a Unix socket answering ``show stat`` (mode 600)."""
    ms = _milliseconds
    # HAProxy takes a single-quoted string as it is: the body has no single quote.
    too_many = json.dumps(
        {
            "detail": f"{config.max_connections_per_client} connections from one client are "
            "open (the load balancer caps them); reuse them or try again shortly",
            "parameter": None,
        }
    )
    lines = [
        "# Written by infra/balancer.py.",
        "global",
        "    maxconn 4096",
        # Its own alerts only (a replica going down or up): no line per request.
        "    log stderr format raw local0 notice",
    ]
    if stats_socket is not None:
        lines.append(f"    stats socket {stats_socket} mode 600 level user")
    lines += [
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option dontlog-normal",
        # X-Forwarded-For: the client's address, and only it (frontend api drops the one a
        # client sent: the balancer is the edge, and a forged address must not count).
        "    option forwardfor",
        f"    timeout connect {ms(config.connect_timeout_s)}",
        f"    timeout client {ms(config.answer_timeout_s)}",
        f"    timeout server {ms(config.answer_timeout_s)}",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 5s",
        f"    timeout queue {ms(config.queue_timeout_s)}",
        # A request no replica read (refused, closed unanswered) goes to another one.
        "    retries 2",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response",
        "",
        "frontend api",
        f"    bind {config.host}:{config.port}",
        "    stick-table type ipv6 size 100k expire 30s store conn_cur",
        "    tcp-request connection track-sc0 src",
        "    http-request del-header x-forwarded-for",
        "    http-request deny deny_status 429 content-type application/json "
        f"string '{too_many}' hdr retry-after 1 "
        f"if {{ sc0_conn_cur gt {config.max_connections_per_client} }}",
        "    default_backend replicas",
        "",
        "backend replicas",
        "    balance roundrobin",
        "    option httpchk",
        f"    http-check send meth GET uri {CHECK_PATH} ver HTTP/1.1 hdr Host balancer",
        "    http-check expect status 200",
        f"    default-server check inter {ms(config.check_interval_s)} fall 2 rise 1 "
        f"maxconn {config.replica_connections}",
        *(f"    server {r.name} {r.host}:{r.port}" for r in config.replicas),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ReplicaState:
    """One replica as HAProxy sees it: ``UP``, ``DOWN`` (its checks fail), ``MAINT``...; the
    requests it was sent, and how many got each class of status."""

    name: str
    status: str
    requests: int
    responses: dict[str, int]


class Balancer:
    """HAProxy for ``config``, its files (configuration, stats socket, log) in ``run_dir``:
    :meth:`start` and :meth:`stop`, or a ``with`` block."""

    def __init__(self, config: BalancerConfig, run_dir: Path, *, binary: Path | None = None):
        self.config = config
        self.run_dir = run_dir.absolute()
        self.config_file = self.run_dir / "haproxy.cfg"
        self.log_file = self.run_dir / "haproxy.log"
        self.stats_socket = self.run_dir / "haproxy.sock"
        if len(str(self.stats_socket).encode()) > _MAX_SOCKET_PATH:
            raise BalancerError(
                f"'run_dir' is too long for a Unix socket ({self.stats_socket}): pick a shorter one"
            )
        self.binary = binary or haproxy_binary()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def pid(self) -> int | None:
        """HAProxy's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self, *, timeout_s: float = 10.0) -> None:
        """Write the configuration, have HAProxy check it, start it and wait until it listens."""
        if self._process is not None:
            raise BalancerError("the balancer is running already")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(haproxy_config(self.config, stats_socket=self.stats_socket))
        checked = subprocess.run(
            [str(self.binary), "-c", "-q", "-f", str(self.config_file)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if checked.returncode != 0:
            raise BalancerError(
                f"HAProxy refused {self.config_file}: {(checked.stderr or checked.stdout).strip()}"
            )
        with self.log_file.open("ab") as log:  # HAProxy keeps its own descriptor
            self._process = subprocess.Popen(
                [str(self.binary), "-db", "-f", str(self.config_file)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not _listening(self.config.host, self.config.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BalancerError(
                    f"HAProxy did not listen on {self.config.host}:{self.config.port} within "
                    f"{timeout_s:g} s: see {self.log_file}"
                )
            time.sleep(0.05)

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop HAProxy (SIGTERM: at once, open connections closed); a no-op if not running."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.stats_socket.unlink(missing_ok=True)

    def replicas(self) -> dict[str, ReplicaState]:
        """Each replica's state from the stats socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            received = b""
            while data := sock.recv(65536):
                received += data
        rows = csv.DictReader(io.StringIO(received.decode().removeprefix("# ")))
        return {
            row["svname"]: ReplicaState(
                name=row["svname"],
                status=row["status"].split()[0],
                requests=int(row["stot"] or 0),
                responses={f"{n}xx": int(row[f"hrsp_{n}xx"] or 0) for n in (1, 2, 3, 4, 5)},
            )
            for row in rows
            if row.get("pxname") == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_until_up(self, names: Sequence[str] | None = None, *, timeout_s: float = 60) -> None:
        """Wait until the replicas ``names`` (default: all) pass their checks."""
        wanted = set(names if names is not None else (r.name for r in self.config.replicas))
        deadline = time.monotonic() + timeout_s
        while True:
            up = {name for name, state in self.replicas().items() if state.status == "UP"}
            if wanted <= up:
                return
            if time.monotonic() > deadline:
                raise BalancerError(
                    f"replicas {sorted(wanted - up)} did not pass the balancer's check "
                    f"({CHECK_PATH}) within {timeout_s:g} s"
                )
            time.sleep(0.1)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def haproxy_binary() -> Path:
    """HAProxy's executable, or a BalancerError saying how to install it."""
    found = shutil.which("haproxy") or (
        str(_DEBIAN_BINARY) if os.access(_DEBIAN_BINARY, os.X_OK) else None
    )
    if found is None:
        raise BalancerError(
            "HAProxy is not installed: `make test` and `make bench` install it "
            "(infra/system-packages.sh haproxy), or `apt-get install haproxy`"
        )
    return Path(found)


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _milliseconds(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"
