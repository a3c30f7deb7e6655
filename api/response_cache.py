"""Rendered responses per request, tagged with the lake snapshot they were computed from.

Least-recently-used and bounded in entries and in bytes (an entry larger than an eighth of the
bytes is not kept: a few huge answers must not push out every dashboard's). Concurrent requests
for the same missing entry wait for one computation (single flight). When a new snapshot
appears (the speed layer commits every second), a request may get the previous snapshot's
answer — consistent, at most ``max_stale_s`` old, its freshness fields naming the versions it
read — while one background computation brings the entry up to date: recomputing on the
request path would put a full query into the latency of every client that arrives during that
second. With :meth:`ResponseCache.refresh_ahead`, called with each new snapshot, the answers
read in the last ``ahead_s`` seconds are recomputed at once, in the same background thread
(cheapest first, within ``ahead_budget_s`` of their last computing time per snapshot), so a
dashboard that polls gets the new snapshot's answer on its next request instead of the one
after.

Refusals are answers too: an answer that could not be given (over the byte cap, stopped at the
time limit) is remembered for the snapshot it was computed on and, for ``refusal_s``, for later
ones — the lake only grows meanwhile — so asking again costs nothing (:meth:`peek` raises it).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Sized)


@dataclass(frozen=True)
class _Refusal:
    version: Hashable
    error: BaseException
    at: float


@dataclass(frozen=True)
class _Entry(Generic[T]):
    version: Hashable
    body: T
    computed_at: float
    size: int
    cost: float = 0.0  # seconds its computation took


class ResponseCache(Generic[T]):
    """Answers of type ``T`` (rendered bodies) per key and snapshot version."""

    def __init__(  # noqa: PLR0913 - keyword-only settings, each with a default
        self,
        entries: int,
        *,
        max_bytes: int = 64 * 2**20,
        max_stale_s: float = 0.0,
        ahead_s: float = 10.0,
        ahead_budget_s: float = 0.25,
        refusal_s: float = 0.0,
        refused: Callable[[BaseException], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if entries < 0:
            raise ValueError(f"'entries' must be >= 0, got {entries}")
        if max_bytes < 0:
            raise ValueError(f"'max_bytes' must be >= 0, got {max_bytes}")
        if max_stale_s < 0:
            raise ValueError(f"'max_stale_s' must be >= 0, got {max_stale_s}")
        self.entries = entries
        self.max_bytes = max_bytes
        self.max_stale_s = max_stale_s
        self.ahead_s = ahead_s
        self.ahead_budget_s = ahead_budget_s
        if refusal_s < 0:
            raise ValueError(f"'refusal_s' must be >= 0, got {refusal_s}")
        self.refusal_s = refusal_s
        # Which errors of a computation are refusals to remember (None: none).
        self._refused = refused
        self._clock = clock
        self.refusal_hits = 0
        self._refusals: OrderedDict[Hashable, _Refusal] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.stale_hits = 0
        self.misses = 0
        self.ahead_refreshes = 0
        self._data: OrderedDict[Hashable, _Entry[T]] = OrderedDict()
        # key -> (its computation for a given snapshot, when it was last read): refresh_ahead.
        self._ahead: OrderedDict[Hashable, tuple[Callable[[Any], T], float]] = OrderedDict()
        self._pending: dict[tuple[Hashable, Hashable], Future[T]] = {}
        self._lock = threading.Lock()
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-refresh")

    def close(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)

    def peek(
        self,
        key: Hashable,
        version: Hashable,
        compute: Callable[[], T],
        *,
        ahead: Callable[[Any], T] | None = None,
        accept: Callable[[Hashable], bool] | None = None,
    ) -> T | None:
        """The body for ``key`` at ``version`` (or, within ``max_stale_s``, an earlier one
        that ``accept``s its version, while ``compute`` refreshes it in the background) if
        there is one; never blocks on a computation, so an event loop may call it. None: call
        :meth:`get` (in a thread).

        ``ahead(snapshot)`` computes the answer for another snapshot: given, the key is
        recomputed by :meth:`refresh_ahead` while it keeps being read."""
        if self.entries == 0:
            return None
        with self._lock:
            self._raise_refusal(key, version)
            if ahead is not None:
                self._ahead[key] = (ahead, self._clock())
                self._ahead.move_to_end(key)
                while len(self._ahead) > self.entries:
                    self._ahead.popitem(last=False)
            return self._cached(key, version, compute, accept)

    def _raise_refusal(self, key: Hashable, version: Hashable) -> None:
        """Under the lock: raise the refusal remembered for ``key`` if it holds at ``version``."""
        refusal = self._refusals.get(key)
        if refusal is None:
            return
        if refusal.version != version and self._clock() - refusal.at > self.refusal_s:
            del self._refusals[key]
            return
        self.refusal_hits += 1
        # Its traceback reset: raising the one instance again would grow it with every request.
        raise refusal.error.with_traceback(None)

    def _remember_refusal(self, key: Hashable, version: Hashable, error: BaseException) -> None:
        """Under the lock: keep ``error`` as ``key``'s answer at ``version`` if it is a refusal."""
        if self._refused is None or not self._refused(error):
            return
        self._refusals[key] = _Refusal(version, error, self._clock())
        self._refusals.move_to_end(key)
        while len(self._refusals) > self.entries:
            self._refusals.popitem(last=False)

    def refresh_ahead(self, version: Hashable, snapshot: object) -> int:
        """Start recomputing, for ``snapshot`` (identified by ``version``), the answers read in
        the last ``ahead_s`` seconds with an ``ahead`` computation: cheapest first, while their
        last computing times add up to at most ``ahead_budget_s``. Returns how many started."""
        started = 0
        with self._lock:
            now = self._clock()
            recent = []
            for key, (ahead, read_at) in list(self._ahead.items()):
                if now - read_at > self.ahead_s:
                    del self._ahead[key]
                    continue
                entry = self._data.get(key)
                if entry is None or entry.version == version or (key, version) in self._pending:
                    continue
                recent.append((entry.cost, key, ahead))
            budget = self.ahead_budget_s
            for cost, key, ahead in sorted(recent, key=lambda item: item[0]):
                if cost > budget:
                    break
                budget -= cost
                future: Future[T] = Future()
                self._pending[(key, version)] = future
                compute = functools.partial(ahead, snapshot)
                self._background.submit(self._fill, key, version, compute, future)
                started += 1
            self.ahead_refreshes += started
        return started

    def claim(self, key: Hashable, version: Hashable) -> tuple[Future[T], bool]:
        """The future of ``key`` at ``version`` and whether the caller owns it: the computation
        under way (the caller waits for it, e.g. with ``asyncio.wrap_future``, holding no thread),
        or a new one the caller must complete with :meth:`fill` (or :meth:`abandon`). For
        callers that admit computations themselves: only the owner needs a place."""
        with self._lock:
            future = self._pending.get((key, version))
            if future is not None:
                self.hits += 1  # as a waiter in get() counts
                return future, False
            future = self._pending[(key, version)] = Future()
            self.misses += 1
            return future, True

    def fill(
        self, key: Hashable, version: Hashable, compute: Callable[[], T], future: Future[T]
    ) -> None:
        """Compute a claimed answer: cache it and complete ``future`` (or fail it)."""
        self._fill(key, version, compute, future)

    def abandon(
        self, key: Hashable, version: Hashable, future: Future[T], error: BaseException
    ) -> None:
        """Give up a claimed answer without computing it: its waiters get ``error``."""
        with self._lock:
            if self._pending.get((key, version)) is future:
                del self._pending[(key, version)]
        if not future.done():
            future.set_exception(error)

    def get(self, key: Hashable, version: Hashable, compute: Callable[[], T]) -> T:
        """The body for ``key`` at ``version`` (or, within ``max_stale_s``, an earlier one)."""
        if self.entries == 0:
            return compute()
        with self._lock:
            body = self._cached(key, version, compute)
            if body is not None:
                return body
            pending = self._pending.get((key, version))
            owner = pending is None
            if pending is None:
                pending = self._pending[(key, version)] = Future()
                self.misses += 1
            else:
                self.hits += 1
        if owner:
            self._fill(key, version, compute, pending)
        return pending.result()

    def _cached(
        self,
        key: Hashable,
        version: Hashable,
        compute: Callable[[], T],
        accept: Callable[[Hashable], bool] | None = None,
    ) -> T | None:
        """Under the lock: a current entry, or a stale one fresh enough and ``accept``ed
        (starting its refresh)."""
        entry = self._data.get(key)
        if entry is None:
            return None
        self._data.move_to_end(key)
        if entry.version == version:
            self.hits += 1
            return entry.body
        if self._clock() - entry.computed_at > self.max_stale_s:
            return None
        if accept is not None and not accept(entry.version):
            return None
        self.stale_hits += 1
        if (key, version) not in self._pending:
            future: Future[T] = Future()
            self._pending[(key, version)] = future
            self._background.submit(self._fill, key, version, compute, future)
        return entry.body

    def _fill(
        self, key: Hashable, version: Hashable, compute: Callable[[], T], future: Future[T]
    ) -> None:
        began = self._clock()
        try:
            body = compute()
        except BaseException as exc:
            with self._lock:
                del self._pending[(key, version)]
                self._remember_refusal(key, version, exc)
            future.set_exception(exc)
            return
        cost = self._clock() - began
        size = len(body)
        with self._lock:
            del self._pending[(key, version)]
            current = self._data.get(key)
            if current is None or current.version != version:
                if current is not None:
                    self.bytes -= current.size
                    del self._data[key]
                if size <= self.max_bytes // 8:
                    self._data[key] = _Entry(version, body, self._clock(), size, cost)
                    self.bytes += size
                while len(self._data) > self.entries or self.bytes > self.max_bytes:
                    _, evicted = self._data.popitem(last=False)
                    self.bytes -= evicted.size
        future.set_result(body)
