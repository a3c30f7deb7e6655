"""The limits store of one replica: everything counted in this process, as before replicas."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable

from access.key_usage import KeyUseRecorder, UsageRecorder
from api.limits.store import Lease
from lake.settings import LakeSettings
from serving_layer.sandbox.backoff import BackoffBook, Backoffs, ClientBackoff


class LocalShares:
    """Computations per client in this process; thread-safe, never waits."""

    blocking = False

    def __init__(self, what: str) -> None:
        self.what = what
        self._running: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def take(self, client: str, share: int) -> Lease | None:
        with self._lock:
            if self._running[client] >= share:
                return None
            self._running[client] += 1
            return Lease(self.what, client, next(self._ids))

    def give_back(self, lease: Lease) -> None:
        with self._lock:
            self._running[lease.client] -= 1
            if self._running[lease.client] <= 0:
                del self._running[lease.client]


class LocalLimits:
    """Each limit counted by this process alone: right for one replica (``API_LIMITS_URL``
    unset)."""

    shared = False

    def shares(self, what: str, *, longest_s: float) -> LocalShares:
        # A process's own count needs no expiry: its leases end with it.
        return LocalShares(what)

    def backoffs(self, policy: ClientBackoff, clock: Callable[[], float]) -> BackoffBook:
        return Backoffs(policy, clock)

    def key_uses(self, lake: LakeSettings, flush_s: float) -> KeyUseRecorder:
        return UsageRecorder(lake, flush_s=flush_s)

    def check(self) -> None:
        """Nothing to reach."""

    def close(self) -> None:
        """Nothing held."""
