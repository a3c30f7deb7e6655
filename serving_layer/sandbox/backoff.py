"""Back-off of the clients whose SQL queries cost workers: a pause that doubles with each
strike, strikes forgiven with quiet time, all timed by a clock the owner gives (the pool's:
``time.monotonic`` in production, one the test moves in tests).

:class:`Backoffs` keeps them in the process; a :class:`BackoffBook` kept elsewhere (the API's
limits store, shared by its replicas) can take its place in the pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

# Clients remembered in back-off at most; past that the longest-quiet ones are forgotten.
_MAX_BACKOFF_CLIENTS: Final = 4096

# Strikes per costly query: stopped at the time limit (DuckDB's interrupt), or its worker lost
# (killed at the hard limit, crashed, out of memory: a fresh interpreter must start).
STOPPED_STRIKES: Final = 1
WORKER_LOST_STRIKES: Final = 2


@dataclass(frozen=True)
class ClientBackoff:
    """How long a client whose queries cost workers waits: ``first_s`` after its first
    strike, doubling with each strike it still has, at most ``max_s``; a strike is forgiven
    per ``forgive_s`` without a new one (success forgives nothing)."""

    first_s: float = 1.0
    max_s: float = 60.0
    forgive_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(
                f"'first_s' must be > 0 and at most 'max_s' ({self.max_s:g}), got {self.first_s:g}"
            )
        if self.forgive_s <= 0:
            raise ValueError(f"'forgive_s' must be > 0, got {self.forgive_s:g}")

    def pause_s(self, strikes: int) -> float:
        """The pause after a strike that leaves ``strikes`` (>= 1)."""
        return min(self.first_s * 2.0 ** min(strikes - 1, 64), self.max_s)

    def remaining(self, strikes: int, quiet_s: float) -> int:
        """The strikes left of ``strikes`` after ``quiet_s`` seconds without a new one."""
        return max(0, strikes - int(quiet_s // self.forgive_s))


class BackoffBook(Protocol):
    """The clients backed off under ``policy``: what the pool asks, wherever they are kept."""

    policy: ClientBackoff

    def wait_s(self, client: str) -> float:
        """Seconds ``client``'s queries are still refused for (0: none)."""
        ...

    def strikes(self, client: str) -> int:
        """The strikes ``client`` has now (0: not backed off)."""
        ...

    def strike(self, client: str, strikes: int) -> float:
        """Count ``strikes`` against ``client`` (a query that cost them); its pause now."""
        ...


@dataclass
class _Struck:
    """A client's ``strikes`` as of ``struck_at``, refused until ``until``."""

    strikes: int
    struck_at: float
    until: float


class Backoffs:
    """The clients backed off under ``policy``, timed by ``clock`` (seconds); thread-safe."""

    def __init__(self, policy: ClientBackoff, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._struck: dict[str, _Struck] = {}
        self._lock = threading.Lock()

    def wait_s(self, client: str) -> float:
        """Seconds ``client``'s queries are still refused for (0: none)."""
        now = self._clock()
        with self._lock:
            struck = self._struck.get(client)
            return 0.0 if struck is None else max(0.0, struck.until - now)

    def strikes(self, client: str) -> int:
        """The strikes ``client`` has now (0: not backed off)."""
        with self._lock:
            struck = self._struck.get(client)
            if struck is None:
                return 0
            return self.policy.remaining(struck.strikes, self._clock() - struck.struck_at)

    def strike(self, client: str, strikes: int) -> float:
        """Count ``strikes`` against ``client`` (a query that cost them); its pause now."""
        now = self._clock()
        with self._lock:
            struck = self._struck.pop(client, None)
            left = (
                0
                if struck is None
                else self.policy.remaining(struck.strikes, now - struck.struck_at)
            )
            total = left + strikes
            pause_s = self.policy.pause_s(total)
            # Last: the dict is ordered by the latest strike.
            self._struck[client] = _Struck(total, now, now + pause_s)
            while len(self._struck) > _MAX_BACKOFF_CLIENTS:
                del self._struck[next(iter(self._struck))]
        return pause_s
