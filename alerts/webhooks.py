"""An alert's delivery to its rule's webhook: the alert as JSON, POSTed with an HMAC-SHA256
signature of its timestamp and body under the rule's secret, retried with exponential back-off
on a network error, a 5xx, a 408 or a 429, and given up after the last try (the evaluator then
records it as a dead letter in alerts/events, with the reason).

A receiver checks ``X-Ctr-Signature`` = ``sha256=`` + hex(HMAC-SHA256(secret, timestamp + "." +
body)) with the ``X-Ctr-Timestamp`` header, and refuses a timestamp too old (a replay)."""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import orjson

USER_AGENT: Final = "ctr-lambda-alerts/1"
# Statuses worth another try: the receiver may answer later.
RETRIED: Final = frozenset({408, 429})


@dataclass(frozen=True)
class Delivery:
    delivered: bool
    attempts: int
    status: int | None  # the last answer's HTTP status; None: no answer
    error: str = ""

    def __str__(self) -> str:
        if self.delivered:
            return f"delivered (HTTP {self.status}, try {self.attempts})"
        return f"failed after {self.attempts} tries: {self.error}"


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
    attempts: int = 5,
    first_delay_s: float = 1.0,
    timeout_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Delivery:
    """POST ``payload`` to ``url``, signed; up to ``attempts`` tries, ``first_delay_s`` before
    the second, doubling after each."""
    body = orjson.dumps(payload)
    status: int | None = None
    error = ""
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            sleep(first_delay_s * 2 ** (attempt - 2))
        timestamp = str(int(clock()))
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "X-Ctr-Timestamp": timestamp,
                "X-Ctr-Signature": signature(secret, timestamp, body),
                "X-Ctr-Attempt": str(attempt),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return Delivery(True, attempt, response.status)
        except urllib.error.HTTPError as exc:
            status, error = exc.code, f"HTTP {exc.code} {exc.reason}"
            if exc.code < 500 and exc.code not in RETRIED:
                return Delivery(False, attempt, status, error + " (not retried)")
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            status, error = None, f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    return Delivery(False, attempts, status, error)
