"""The latest :class:`~serving_layer.lake_snapshot.LakeSnapshot` of the served Delta tables,
kept current for the requests that read it.

:class:`SnapshotSource` looks at each table's log at most every ``refresh_s`` seconds (the
tables the speed job commits every second) or ``seldom_s`` (the others), and follows new commits
incrementally (:mod:`serving_layer.log_tail`); with ``max_stale_s``, requests get the current
snapshot at once while one background thread keeps it current (for as long as requests keep
coming), instead of a request waiting for the logs to be read; whoever subscribed hears of each
new snapshot (the API's response cache recomputes its recent answers ahead of the next
request). :meth:`SnapshotSource.at_least` catches up with versions a client has already seen;
:meth:`SnapshotSource.at` gives the lake as it was at an earlier moment (as-of queries).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Final

from deltalake import DeltaTable

from lake.settings import LakeSettings
from lake.speed_status import read_status, status_stamp
from lake.storage import open_delta
from serving_layer.delta_log import log_of
from serving_layer.lake_snapshot import (
    ALL_TABLES,
    SCHEMAS,
    AsOfError,
    BehindError,
    LakeSnapshot,
    TableSnapshot,
    UnsupportedTableError,
    key_covers,
    log_exists,
    table_snapshot,
)
from serving_layer.log_tail import NeedsReload, follow
from serving_layer.past_snapshots import PastSnapshots

__all__ = [
    "ALL_TABLES",
    "SCHEMAS",
    "AsOfError",
    "BehindError",
    "LakeSnapshot",
    "SnapshotSource",
    "TableSnapshot",
    "UnsupportedTableError",
    "key_covers",
]

_log = logging.getLogger(__name__)
# The tables that change every second (the speed job commits one per micro-batch): their logs
# are looked at every ``refresh_s``; the others' every ``seldom_s``.
OFTEN: Final = frozenset({"speed/ctr"})
# A client's wish for newer versions than a replica has makes it look at those tables' logs at
# once, at most this often (seconds) per table: a client cannot make it list logs nonstop.
_CATCH_UP_S: Final = 0.1


def _check(tables: tuple[str, ...], **seconds: float) -> None:
    for name, value in seconds.items():
        if value < 0:
            raise ValueError(f"'{name}' must be >= 0, got {value}")
    unknown = set(tables) - set(SCHEMAS)
    if unknown:
        raise ValueError(f"'tables' names unknown tables: {sorted(unknown)}")


class SnapshotSource:
    """Hands out the latest :class:`LakeSnapshot`, looking at each table's Delta log at most
    every ``refresh_s`` seconds for the tables that change every second (:data:`OFTEN`), and
    every ``seldom_s`` for the others (0 for ``refresh_s``: every table on every call).

    Looking costs one request per table (the next version's commit file, usually not there yet:
    :mod:`serving_layer.log_tail`); a new commit patches the table's file list instead of reading
    the table again. :attr:`requests` counts the object-store requests by kind.

    :meth:`cached` never does I/O: it returns the current snapshot while that is less than
    ``refresh_s + max_stale_s`` old (consistent, only older) and, when a refresh is due, starts
    one background thread that refreshes every ``refresh_s`` until nobody has called
    :meth:`cached` for ``keep_current_s`` (so a steady reader never meets a due refresh, and an
    idle API lists no logs). :meth:`current` always waits for a due refresh; :meth:`at_least`
    for the versions a client has already seen. Callbacks given to :meth:`subscribe` get each
    new snapshot from the refreshing thread (keep them short). ``clock`` gives monotonic
    seconds (tests drive it instead of sleeping).
    """

    def __init__(
        self,
        lake: LakeSettings,
        *,
        tables: tuple[str, ...] = ALL_TABLES,
        refresh_s: float = 0.5,
        seldom_s: float | None = None,
        max_stale_s: float = 0.0,
        keep_current_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check(tables, refresh_s=refresh_s, seldom_s=seldom_s or 0, max_stale_s=max_stale_s)
        self.lake = lake
        self.tables = tables
        self.refresh_s = refresh_s
        self.seldom_s = (
            refresh_s if seldom_s is None or refresh_s == 0 else max(seldom_s, refresh_s)
        )
        self.max_stale_s = max_stale_s
        self.keep_current_s = keep_current_s
        self.background_refreshes = 0
        # Object-store requests by kind (api.metrics.object_store_requests says which).
        self.requests: Counter[str] = Counter()
        self._requests_lock = threading.Lock()
        self._clock = clock  # monotonic seconds: the refresh and keep-current intervals
        self._handles: dict[str, DeltaTable] = {}
        self._roots: dict[str, str] = {}  # each table's root as its file URIs spell it
        self._looked_at: dict[str, float] = {}  # when each table's log was last looked at
        self._status_at = float("-inf")
        self._current: LakeSnapshot | None = None
        self._refreshed_at = float("-inf")
        self._used_at = float("-inf")
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()  # held by the background refresher while it runs
        self._closed = threading.Event()
        self._subscribers: list[Callable[[LakeSnapshot], None]] = []
        # On an object store each table's log is a round trip (a listing from its version):
        # the tables are read side by side (python -m bench storage, a new snapshot of 11
        # tables: 48 ms, then 17 ms with the missing ones checked through pyarrow).
        self._readers = (
            ThreadPoolExecutor(max_workers=len(tables), thread_name_prefix="snapshot-table")
            if lake.on_object_store and tables
            else None
        )
        self._past = PastSnapshots(lake, tables)

    def _count(self, kind: str, requests: int) -> None:
        with self._requests_lock:
            self.requests[kind] += requests

    def interval_s(self, table: str) -> float:
        """How often ``table``'s log is looked at (seconds)."""
        return self.refresh_s if table in OFTEN else self.seldom_s

    def cached(self) -> LakeSnapshot | None:
        """The latest snapshot without I/O (for an event loop), or None: call :meth:`current`.

        None when there is none yet or it is older than ``refresh_s + max_stale_s``; a snapshot
        past ``refresh_s`` is returned while a background refresh replaces it."""
        current = self._current
        if current is None:
            return None
        now = self._used_at = self._clock()
        age = now - self._refreshed_at
        if age < self.refresh_s:
            return current
        if age >= self.refresh_s + self.max_stale_s:
            return None
        if not self._closed.is_set() and self._refreshing.acquire(blocking=False):
            threading.Thread(
                target=self._keep_current, name="snapshot-refresh", daemon=True
            ).start()
        return current

    @property
    def keeping_current(self) -> bool:
        """Whether the background refresher is running."""
        return self._refreshing.locked()

    def subscribe(self, callback: Callable[[LakeSnapshot], None]) -> None:
        """Call ``callback(snapshot)`` with every new snapshot (other versions than before)."""
        self._subscribers.append(callback)

    def close(self) -> None:
        """Stop the background refresher (the source still answers :meth:`current`)."""
        self._closed.set()
        if self._readers is not None:
            self._readers.shutdown(wait=False)

    def _keep_current(self) -> None:
        """Refresh every ``refresh_s`` while :meth:`cached` was called within
        ``keep_current_s``."""
        try:
            while not self._closed.is_set():
                try:
                    self.background_refreshes += 1
                    self.current()
                except Exception as exc:  # current() raises it to requests once too old
                    _log.warning("refreshing the lake snapshot failed (will retry): %s", exc)
                if self._clock() - self._used_at >= self.keep_current_s:
                    return
                due = self._refreshed_at + self.refresh_s - self._clock()
                self._closed.wait(max(due, 0.05))  # refresh_s=0: not a busy loop
        finally:
            self._refreshing.release()

    def current(self) -> LakeSnapshot:
        now = self._clock()
        current = self._current
        if current is not None and now - self._refreshed_at < self.refresh_s:
            return current
        with self._lock:
            if self._current is not None and self._clock() - self._refreshed_at < self.refresh_s:
                return self._current
            return self._replace(self._refresh(self._current))

    def at_least(self, wanted: Mapping[str, int]) -> LakeSnapshot:
        """The latest snapshot, holding every table of ``wanted`` (name to version) at that
        version or a newer one: the tables this source holds at older versions have their logs
        looked at now (waiting first for 0.1 s to have passed since their last look, so clients
        cannot make it look nonstop). :class:`BehindError` if they are still older (not
        committed yet as far as this process can see)."""
        snapshot = self.current()
        behind = snapshot.behind(wanted)
        if not behind:
            return snapshot
        since = min(self._clock() - self._looked_at.get(n, float("-inf")) for n in behind)
        if since < _CATCH_UP_S:
            time.sleep(_CATCH_UP_S - since)
        with self._lock:
            now = self._clock()
            due = [n for n in behind if now - self._looked_at.get(n, float("-inf")) >= _CATCH_UP_S]
            if due and self._current is not None:
                snapshot = self._replace(self._refresh(self._current, now=due))
            behind = snapshot.behind(wanted)
        if behind:
            raise BehindError(
                "this API process has not read the versions a previous answer named yet ("
                + ", ".join(f"{n} {wanted[n]}" for n in behind)
                + "); ask again in a moment"
            )
        return snapshot

    def _replace(self, fresh: LakeSnapshot) -> LakeSnapshot:
        """Under the lock: ``fresh`` becomes the current snapshot; subscribers hear of it when
        its versions are new."""
        previous = self._current
        self._current = fresh
        self._refreshed_at = self._clock()
        if previous is not None and fresh.key != previous.key:
            for callback in self._subscribers:
                try:
                    callback(fresh)
                except Exception:  # a subscriber's failure must not fail the refresh
                    _log.exception("a lake snapshot subscriber failed")
        return fresh

    def _refresh(self, previous: LakeSnapshot | None, *, now: Collection[str] = ()) -> LakeSnapshot:
        """The snapshot after looking at the logs that are due (all without ``previous``),
        and at those of ``now``."""
        clock = self._clock()

        def due(name: str) -> bool:
            looked_at = self._looked_at.get(name, float("-inf"))
            return previous is None or name in now or clock - looked_at >= self.interval_s(name)

        def read(name: str) -> TableSnapshot:
            return self._table(name, previous.tables.get(name) if previous is not None else None)

        names = [name for name in self.tables if due(name)]
        for name in names:
            self._looked_at[name] = clock
        readers = self._readers
        if readers is not None and not self._closed.is_set() and len(names) > 1:
            tables = dict(zip(names, readers.map(read, names), strict=True))
        else:
            tables = {name: read(name) for name in names}
        if previous is not None:
            tables = {n: tables[n] if n in tables else previous.tables[n] for n in self.tables}
        if previous is not None and clock - self._status_at < self.refresh_s:
            return replace(previous, tables=tables)
        self._status_at = clock
        # One HEAD (a stat on a local disk) per refresh: the file is read only when it changed.
        stamp = status_stamp(self.lake)
        self._count("status", 1)
        if previous is not None and stamp == previous.status_stamp:
            status = previous.status
        else:
            status = read_status(self.lake) if stamp is not None else None
            self._count("status", int(stamp is not None))
        return LakeSnapshot(
            tables=tables, status=status, store=self.lake.object_store, status_stamp=stamp
        )

    def _table(self, name: str, old: TableSnapshot | None) -> TableSnapshot:
        path = self.lake.table(name)
        if old is None or old.version is None:
            self._count("exists", 1)
            if not log_exists(path, self.lake.object_store):
                return TableSnapshot(name, path, None, (), (), SCHEMAS[name])
            return self._reload(name, path)
        try:
            tail = follow(
                log_of(path, self.lake.object_store), self._roots[name], old.version, old.files
            )
        except NeedsReload as reason:
            self._count("commit", 1)  # at least: the commit it could not follow
            _log.info("%s is read again from its log: %s", name, reason)
            return self._reload(name, path)
        self._count("commit", tail.requests)
        if tail.version == old.version:
            return old
        return replace(old, version=tail.version, files=tail.files)

    def _reload(self, name: str, path: str) -> TableSnapshot:
        """``name`` read whole through delta-rs (its first read, or a commit the log's tail
        cannot follow)."""
        self._count("reload", 1)
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = open_delta(path, self.lake.object_store)
        else:
            handle.update_incremental()
        root = handle.table_uri.rstrip("/")
        self._roots[name] = root.removeprefix("file://")
        return table_snapshot(name, path, handle)

    def at(self, moment: dt.datetime) -> LakeSnapshot:
        """The lake as of ``moment`` (:meth:`PastSnapshots.at`); never the current snapshot."""
        return self._past.at(moment, self._current)
