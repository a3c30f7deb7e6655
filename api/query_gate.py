"""Admission for work that computes an answer: a few at once, a bounded queue, and no client
holding every place.

At most ``workers`` computations run at once, of them at most ``per_client`` for one client (the
API's clients are its keys), so one client's heavy queries leave a place for everyone else's;
up to ``queue`` more requests wait (first come, first served among those whose client has a
free place), each at most ``queue_timeout_s``, of them at most half of ``queue`` (at least one)
of one client, so one client cannot fill the queue either. Beyond that :class:`GateBusyError`
(a 429). The gate lives on the event loop: acquiring it never holds a thread.

The workers and the queue are the process's; a client's share may be counted for every
replica of the API (``shares``, from :mod:`api.limits`): a client that has ``per_client``
computations running on any of them is refused at once (a 429 that says so), after its place
here was granted and before it computes. Counting in a database takes a thread, not the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from anyio import to_thread

from api.errors import GateBusyError
from api.limits.store import KeyShares, Lease

log = logging.getLogger("ctr.limits")


@dataclass(frozen=True)
class GateStats:
    running: int
    waiting: int
    admitted: int
    rejected_busy: int


class QueryGate:
    """Admission of computations per client; use from one event loop."""

    def __init__(
        self,
        *,
        workers: int,
        per_client: int,
        queue: int,
        queue_timeout_s: float,
        what: str = "queries",
        setting: str = "API_CTR",
        shares: KeyShares | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"'workers' must be >= 1, got {workers}")
        if not 1 <= per_client <= workers:
            raise ValueError(f"'per_client' must be within 1..{workers}, got {per_client}")
        if queue < 0:
            raise ValueError(f"'queue' must be >= 0, got {queue}")
        if queue_timeout_s <= 0:
            raise ValueError(f"'queue_timeout_s' must be > 0, got {queue_timeout_s}")
        self.workers = workers
        self.per_client = per_client
        self.queue = queue
        self.queue_timeout_s = queue_timeout_s
        self._what = what
        self._setting = setting
        self._shares = shares
        self._running: Counter[str] = Counter()
        self._waiters: deque[tuple[str, asyncio.Future[None]]] = deque()
        self._admitted = 0
        self._rejected = 0

    @contextlib.asynccontextmanager
    async def place(self, client: str) -> AsyncIterator[None]:
        """Hold a place for ``client`` for the duration of the block."""
        await self._acquire(client)
        try:
            lease = await self._lease(client)
        except BaseException:
            self._release(client)
            raise
        self._admitted += 1
        try:
            yield
        finally:
            self._release(client)
            if lease is not None:
                await self._give_back(lease)

    async def _lease(self, client: str) -> Lease | None:
        """The client's share counted where every replica counts it; GateBusyError if it has
        its share running (None: not counted beyond this gate)."""
        shares = self._shares
        if shares is None:
            return None
        if shares.blocking:
            lease = await to_thread.run_sync(shares.take, client, self.per_client)
        else:
            lease = shares.take(client, self.per_client)
        if lease is None:
            self._rejected += 1
            raise GateBusyError(
                f"this key has {self.per_client} {self._what} running across the API's "
                f"replicas, its share ({self._setting}_WORKERS_PER_KEY); try again when one "
                "has answered",
                retry_after_s=1,
            )
        return lease

    async def _give_back(self, lease: Lease) -> None:
        assert self._shares is not None
        try:
            if self._shares.blocking:
                await to_thread.run_sync(self._shares.give_back, lease)
            else:
                self._shares.give_back(lease)
        except Exception:
            # Its answer is computed: the lease lapses by itself (see api.limits).
            log.warning("giving back %s's lease failed", lease.client, exc_info=True)

    def _release(self, client: str) -> None:
        self._running[client] -= 1
        if self._running[client] <= 0:
            del self._running[client]
        self._wake()

    def stats(self) -> GateStats:
        return GateStats(
            running=sum(self._running.values()),
            waiting=len(self._waiters),
            admitted=self._admitted,
            rejected_busy=self._rejected,
        )

    @property
    def waiting_per_client(self) -> int:
        """Requests of one client that may wait at once: half the queue, at least one."""
        return max(1, self.queue // 2)

    def _waiting(self, client: str) -> int:
        return sum(1 for waiter, _ in self._waiters if waiter == client)

    def _can_run(self, client: str) -> bool:
        return (
            sum(self._running.values()) < self.workers and self._running[client] < self.per_client
        )

    async def _acquire(self, client: str) -> None:
        if not self._can_run(client) and self._waiting(client) >= self.waiting_per_client:
            self._rejected += 1
            raise GateBusyError(
                f"this key has {self._running[client]} {self._what} running, its share "
                f"({self._setting}_WORKERS_PER_KEY), and {self._waiting(client)} waiting, half "
                f"of {self._setting}_QUEUE; try again when one has answered",
                retry_after_s=1,
            )
        if len(self._waiters) >= self.queue and not self._can_run(client):
            self._rejected += 1
            raise GateBusyError(
                f"too many {self._what} at once ({self.workers} running, {self.queue} waiting: "
                f"{self._setting}_WORKERS, {self._setting}_QUEUE); try again shortly"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (client, future)
        self._waiters.append(entry)
        self._wake()
        if future.done():  # a place was free
            return
        try:
            await asyncio.wait_for(asyncio.shield(future), self.queue_timeout_s)
        except TimeoutError:
            if future.done():  # granted just as the wait ran out: take it
                return
            self._waiters.remove(entry)
            future.cancel()
            self._rejected += 1
            raise GateBusyError(
                f"no place to compute the answer within {self.queue_timeout_s:g} s "
                f"({self._setting}_QUEUE_TIMEOUT_S); try again",
                retry_after_s=max(1, math.ceil(self.queue_timeout_s / 2)),
            ) from None
        except asyncio.CancelledError:
            # The client went away: give the place back, or leave the queue.
            if future.done() and not future.cancelled():
                self._running[client] -= 1
                if self._running[client] <= 0:
                    del self._running[client]
                self._wake()
            elif entry in self._waiters:
                self._waiters.remove(entry)
            raise

    def _wake(self) -> None:
        """Grant places to waiters in order, skipping those whose client has none free."""
        for entry in list(self._waiters):
            if sum(self._running.values()) >= self.workers:
                return
            client, future = entry
            if self._running[client] < self.per_client and not future.done():
                self._waiters.remove(entry)
                self._running[client] += 1
                future.set_result(None)
