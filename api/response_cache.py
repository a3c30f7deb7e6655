"""Rendered responses per (request, lake snapshot): equal snapshots give equal answers.

Least-recently-used, bounded; concurrent requests for the same missing entry wait for one
computation instead of running it each (single flight), which is what keeps latency flat when
a new speed-layer version invalidates every entry at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable


class _Pending:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: bytes | None = None
        self.error: BaseException | None = None


class ResponseCache:
    def __init__(self, entries: int) -> None:
        if entries < 0:
            raise ValueError(f"'entries' must be >= 0, got {entries}")
        self.entries = entries
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[Hashable, bytes] = OrderedDict()
        self._pending: dict[Hashable, _Pending] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        if self.entries == 0:
            return compute()
        with self._lock:
            found = self._data.get(key)
            if found is not None:
                self._data.move_to_end(key)
                self.hits += 1
                return found
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = _Pending()
                self.misses += 1
            else:
                self.hits += 1
        if not owner:
            pending.done.wait()
            if pending.error is not None:
                raise pending.error
            assert pending.value is not None
            return pending.value
        try:
            pending.value = compute()
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                del self._pending[key]
                if pending.value is not None:
                    self._data[key] = pending.value
                    while len(self._data) > self.entries:
                        self._data.popitem(last=False)
            pending.done.set()
        return pending.value
