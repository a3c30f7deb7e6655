"""Limits at the edge: what a connection may send before the application sees a request.

uvicorn's httptools protocol has no bound on a request's head (an 80 MB header was parsed,
stalling the event loop for everyone for 20 s), no time limit for a head or a body (a slow
sender is held open forever) and no per-client connection cap. :func:`edge_protocol` makes a
subclass that checks every chunk *before* the HTTP parser sees it:

- the request line (414) and the head — request line plus headers — in bytes and in lines
  (431), counted up to the blank line that ends it;
- a head must arrive within ``head_timeout_s`` of its first byte (or of the connection), a body
  within ``body_timeout_s`` of its head (408);
- connections per client address and in total (429 once the request's head is in). A trusted
  proxy's connections (``API_TRUSTED_PROXIES``) count in the total only: each carries many
  clients, whose address the edge cannot know before the headers; the balancer caps them.

A refusal is a small JSON answer with ``Connection: close``; the connection then drains what the
client still sends for a moment before closing (a lingering close, as nginx does), so the client
reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.security_headers import SECURITY_HEADERS

_END_OF_HEAD: Final = b"\r\n\r\n"
# How long, and how much, a refused connection reads and drops before it closes.
_LINGER_S: Final = 2.0
_LINGER_BYTES: Final = 4 * 2**20
_REASONS: Final = {
    408: "Request Timeout",
    414: "URI Too Long",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
}


@dataclass(frozen=True)
class EdgeLimits:
    """What one connection may send, and how many connections there may be."""

    max_head_bytes: int = 32 * 2**10
    max_headers: int = 100
    max_request_line_bytes: int = 8 * 2**10
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024
    max_connections_per_client: int = 64
    # Peers not capped per client (load balancers): their connections count in the total only.
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_head_bytes", "max_headers", "max_request_line_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"'{name}' must be >= 1, got {getattr(self, name)}")
        for name in ("max_connections", "max_connections_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"'{name}' must be >= 1, got {getattr(self, name)}")
        for name in ("head_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"'{name}' must be > 0, got {getattr(self, name)}")


@dataclass
class EdgeState:
    """The limits and what the edge saw: open connections per client, refusals per reason.
    Touched from the event loop only."""

    limits: EdgeLimits
    connections: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    @property
    def open_connections(self) -> int:
        return sum(self.connections.values())

    def is_trusted_proxy(self, peer: str) -> bool:
        """Whether ``peer`` (an address) is one of the limits' trusted proxies."""
        if not self.limits.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.limits.trusted_proxies)


def edge_protocol(state: EdgeState) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``state``'s limits (pass it as ``Config(http=...)``)."""

    class EdgeProtocol(_EdgeProtocol):
        edge = state

    return EdgeProtocol


class _EdgeProtocol(HttpToolsProtocol):
    edge: EdgeState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._peer: str | None = None
        self._over_cap: str | None = None
        self._in_head = True
        self._head_bytes = 0
        self._head_lines = 0
        self._line_seen = False
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._dropped = 0

    # -- connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.edge.limits
        self._peer = self.client[0] if self.client else "unknown"
        if self.edge.open_connections >= limits.max_connections:
            self._over_cap = (
                f"the server has {limits.max_connections} connections open "
                "(API_MAX_CONNECTIONS); try again shortly"
            )
        elif self.edge.connections[
            self._peer
        ] >= limits.max_connections_per_client and not self.edge.is_trusted_proxy(self._peer):
            self._over_cap = (
                f"{limits.max_connections_per_client} connections from one client are open "
                "(API_MAX_CONNECTIONS_PER_CLIENT); reuse them or try again shortly"
            )
        self.edge.connections[self._peer] += 1
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._peer is not None:
            self.edge.connections[self._peer] -= 1
            if self.edge.connections[self._peer] <= 0:
                del self.edge.connections[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._dropped += len(data)
            if self._dropped > _LINGER_BYTES:
                self.transport.close()
            return
        if self._in_head:
            refusal = self._check_head(data)
            if refusal is not None:
                self._refuse(*refusal)
                return
        super().data_received(data)

    # -- parser callbacks ------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._disarm()
        self._arm("body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head, self._head_bytes, self._head_lines = True, 0, 0
        self._line_seen, self._tail = False, b""
        super().on_message_complete()

    # -- the checks ------------------------------------------------------------------------

    def _check_head(self, data: bytes) -> tuple[int, str, str] | None:
        """(status, reason key, message) when the head in ``data`` breaks a limit."""
        limits = self.edge.limits
        if self._head_bytes == 0 and self._timer is None:
            self._arm("head")  # the first byte of a keep-alive connection's next request
        joined = self._tail + data
        end = joined.find(_END_OF_HEAD)
        # Bytes of ``data`` that belong to the head (the rest is its body or the next request).
        taken = len(data) if end < 0 else end + len(_END_OF_HEAD) - len(self._tail)
        head = data[: max(taken, 0)]
        if not self._line_seen:
            newline = head.find(b"\n")
            line_bytes = self._head_bytes + (newline if newline >= 0 else len(head))
            if line_bytes > limits.max_request_line_bytes:
                return (
                    414,
                    "request_line",
                    f"the request line is longer than {limits.max_request_line_bytes} bytes "
                    "(API_MAX_REQUEST_LINE_BYTES)",
                )
            self._line_seen = newline >= 0
        self._head_bytes += len(head)
        self._head_lines += head.count(b"\n")
        if self._head_bytes > limits.max_head_bytes:
            return (
                431,
                "head_bytes",
                f"the request's headers are larger than {limits.max_head_bytes} bytes "
                "(API_MAX_HEADER_BYTES)",
            )
        # The request line and the blank line are lines too.
        if self._head_lines > limits.max_headers + 2:
            return (
                431,
                "header_count",
                f"the request has more than {limits.max_headers} headers (API_MAX_HEADERS)",
            )
        self._tail = joined[-(len(_END_OF_HEAD) - 1) :]
        if end >= 0:
            self._in_head = False
            if self._over_cap is not None:
                return 429, "connections", self._over_cap
        return None

    def _arm(self, what: str) -> None:
        self._disarm()
        limits = self.edge.limits
        delay = limits.head_timeout_s if what == "head" else limits.body_timeout_s
        self._timer = self.loop.call_later(delay, self._timed_out, what)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, what: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        limits = self.edge.limits
        cycle = self.cycle
        if what == "head":
            message = (
                f"the request's headers did not arrive within {limits.head_timeout_s:g} s "
                "(API_HEADER_TIMEOUT_S)"
            )
        else:
            if cycle is None or cycle.response_complete or not cycle.more_body:
                return
            message = (
                f"the request's body did not arrive within {limits.body_timeout_s:g} s "
                "(API_BODY_TIMEOUT_S)"
            )
        if cycle is not None and cycle.response_started:
            self.edge.refused[f"{what}_timeout"] += 1
            self.transport.close()
            return
        self._refuse(408, f"{what}_timeout", message)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` (the request never reaches the application), then close."""
        self._disarm()
        self.edge.refused[reason] += 1
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A request the application is reading: it sees a disconnect, its answer is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        body = orjson.dumps({"detail": message, "parameter": None})
        head = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            "cache-control: no-store",
            *(f"{name.lower()}: {value}" for name, value in SECURITY_HEADERS.items()),
        ]
        if status == 429:
            head.append("retry-after: 1")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self._linger()

    def _linger(self) -> None:
        self._lingering = True
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)
