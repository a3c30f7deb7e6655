"""Rendered responses per request, tagged with the lake snapshot they were computed from.

Least-recently-used and bounded in entries and in bytes (an entry larger than an eighth of the
bytes is not kept: a few huge answers must not push out every dashboard's). Concurrent requests
for the same missing entry wait for one computation (single flight). When a new snapshot
appears (the speed layer commits every second), a request may get the previous snapshot's
answer — consistent, at most ``max_stale_s`` old, its freshness fields naming the versions it
read — while one background computation brings the entry up to date: recomputing on the
request path would put a full query into the latency of every client that arrives during that
second.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", bound=Sized)


@dataclass(frozen=True)
class _Entry(Generic[T]):
    version: Hashable
    body: T
    computed_at: float
    size: int


class ResponseCache(Generic[T]):
    """Answers of type ``T`` (rendered bodies) per key and snapshot version."""

    def __init__(
        self, entries: int, *, max_bytes: int = 64 * 2**20, max_stale_s: float = 0.0
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
        self.bytes = 0
        self.hits = 0
        self.stale_hits = 0
        self.misses = 0
        self._data: OrderedDict[Hashable, _Entry[T]] = OrderedDict()
        self._pending: dict[tuple[Hashable, Hashable], Future[T]] = {}
        self._lock = threading.Lock()
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-refresh")

    def close(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)

    def peek(self, key: Hashable, version: Hashable, compute: Callable[[], T]) -> T | None:
        """The body for ``key`` at ``version`` (or, within ``max_stale_s``, an earlier one, while
        ``compute`` refreshes it in the background) if there is one; never blocks on a
        computation, so an event loop may call it. None: call :meth:`get` (in a thread)."""
        if self.entries == 0:
            return None
        with self._lock:
            return self._cached(key, version, compute)

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

    def _cached(self, key: Hashable, version: Hashable, compute: Callable[[], T]) -> T | None:
        """Under the lock: a current entry, or a stale one fresh enough (starting its refresh)."""
        entry = self._data.get(key)
        if entry is None:
            return None
        self._data.move_to_end(key)
        if entry.version == version:
            self.hits += 1
            return entry.body
        if time.monotonic() - entry.computed_at > self.max_stale_s:
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
        try:
            body = compute()
        except BaseException as exc:
            with self._lock:
                del self._pending[(key, version)]
            future.set_exception(exc)
            return
        size = len(body)
        with self._lock:
            del self._pending[(key, version)]
            current = self._data.get(key)
            if current is None or current.version != version:
                if current is not None:
                    self.bytes -= current.size
                    del self._data[key]
                if size <= self.max_bytes // 8:
                    self._data[key] = _Entry(version, body, time.monotonic(), size)
                    self.bytes += size
                while len(self._data) > self.entries or self.bytes > self.max_bytes:
                    _, evicted = self._data.popitem(last=False)
                    self.bytes -= evicted.size
        future.set_result(body)
