"""An alert's delivery to its rule's webhook: the alert as JSON, POSTed with an HMAC-SHA256
signature of its timestamp and body under the rule's secret, retried with exponential back-off
on a network error, a 5xx, a 408 or a 429, and given up after the last try (the evaluator then
records it as a dead letter in alerts/events).

Each try checks the destination again (:mod:`alerts.destinations`: a public address or one the
operator allowed) after resolving its name, and connects to the address it checked; redirects
are not followed (a 3xx is a failure). What the rule's owner reads of a delivery is one of
:data:`OUTCOMES`; the peer's own words (its status, its error) are for the operator's log only,
so that a webhook cannot be used to learn what answers where.

A receiver checks ``X-Ctr-Signature`` = ``sha256=`` + hex(HMAC-SHA256(secret, timestamp + "." +
body)) with the ``X-Ctr-Timestamp`` header, and refuses a timestamp too old (a replay)."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

import orjson

from alerts.destinations import (
    DestinationError,
    Resolver,
    Target,
    UnresolvedError,
    WebhookPolicy,
    system_resolver,
)

USER_AGENT: Final = "ctr-lambda-alerts/1"
# Statuses worth another try: the receiver may answer later.
RETRIED: Final = frozenset({408, 429})
# What a rule's owner is told of a delivery: sent and taken (2xx); not sent (the destination is
# not allowed, or the owner's deliveries this minute are used up); sent and not taken.
Outcome = Literal["delivered", "refused", "throttled", "failed"]
OUTCOMES: Final = ("delivered", "refused", "throttled", "failed")
# Bytes of an answer read (and dropped) before the connection is closed.
_ANSWER_BYTES: Final = 4096


@dataclass(frozen=True)
class Delivery:
    outcome: Outcome
    attempts: int
    status: int | None = None  # the last answer's HTTP status; None: no answer
    detail: str = ""  # why, for the operator's log (never shown to the rule's owner)

    @property
    def delivered(self) -> bool:
        return self.outcome == "delivered"

    def __str__(self) -> str:
        tries = f"{self.attempts} {'try' if self.attempts == 1 else 'tries'}"
        return f"{self.outcome} after {tries}" + (f": {self.detail}" if self.detail else "")


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of ``timestamp.body`` under ``secret``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signed: str) -> bool:
    """Whether ``signed`` is this body's signature (a receiver's check, in constant time)."""
    return hmac.compare_digest(signature(secret, timestamp, body), signed)


def deliver(  # noqa: PLR0913 - keyword-only knobs of the retry, each with its default
    url: str,
    secret: str,
    payload: Mapping[str, object],
    *,
    policy: WebhookPolicy,
    resolver: Resolver = system_resolver,
    attempts: int = 5,
    first_delay_s: float = 1.0,
    timeout_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Delivery:
    """POST ``payload`` to ``url``, signed, if ``policy`` allows where it resolves to; up to
    ``attempts`` tries, ``first_delay_s`` before the second, doubling after each."""
    body = orjson.dumps(payload)
    status: int | None = None
    detail = ""
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            sleep(first_delay_s * 2 ** (attempt - 2))
        try:
            target = policy.resolve(url, resolver)
        except UnresolvedError as exc:  # a name server's bad minute, maybe: tried again
            status, detail = None, exc.message
            continue
        except DestinationError as exc:
            return Delivery("refused", attempt - 1, None, exc.message)
        timestamp = str(int(clock()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Ctr-Timestamp": timestamp,
            "X-Ctr-Signature": signature(secret, timestamp, body),
            "X-Ctr-Attempt": str(attempt),
        }
        try:
            status = _post(target, body, headers, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            status, detail = None, f"{type(exc).__name__}: {exc}"
            continue
        if 200 <= status < 300:
            return Delivery("delivered", attempt, status)
        detail = f"HTTP {status}"
        if 300 <= status < 400:
            return Delivery("failed", attempt, status, detail + " (redirects are not followed)")
        if status < 500 and status not in RETRIED:
            return Delivery("failed", attempt, status, detail + " (not retried)")
    return Delivery("failed", attempts, status, detail)


def _post(target: Target, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
    """One POST to ``target``'s checked address; the answer's status."""
    connection: http.client.HTTPConnection
    if target.scheme == "https":
        connection = _PinnedHTTPS(target, timeout_s)
    else:
        connection = _PinnedHTTP(target, timeout_s)
    try:
        connection.request("POST", target.path, body=body, headers=dict(headers))
        answer = connection.getresponse()
        answer.read(_ANSWER_BYTES)
        return answer.status
    finally:
        connection.close()


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to the address that was checked, whatever the name resolves to now."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s)
        self.address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to the address that was checked; the certificate is verified for the URL's host."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout_s, context=self.tls)
        self.address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)
