"""The Delta tables the serving layer reads, pinned to one version each per request.

A :class:`LakeSnapshot` names one version of every table (or says a table does not exist yet)
with the Parquet files of that version, so every query of a request reads the same data even
while the speed layer commits a new version every second. :class:`SnapshotSource` keeps one
delta-rs handle per table and refreshes it at most every ``refresh_s`` seconds; with
``max_stale_s``, requests get the current snapshot at once while one background thread keeps it
current (every ``refresh_s``, for as long as requests keep coming), instead of a request waiting
for the logs to be read; whoever subscribed hears of each new snapshot (the API's response
cache recomputes its recent answers ahead of the next request).
:meth:`SnapshotSource.at` gives the lake as it was at an earlier moment (as-of queries).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Final

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from lake.catalog import SERVED, Table
from lake.settings import LakeSettings
from lake.speed_status import SpeedStatus, read_status, status_stamp
from lake.storage import arrow_filesystem, open_delta, store_path
from runtime.object_store import ObjectStoreSettings
from runtime.times import EPOCH
from serving_layer.delta_log import DeltaLog, commit_ns, first_true, log_of, log_span, version_at
from serving_layer.errors import ServingError
from serving_layer.log_tail import NeedsReload, follow

_log = logging.getLogger(__name__)
SCHEMAS: Final[Mapping[str, pa.Schema]] = {t.name: t.schema for t in SERVED}
ALL_TABLES: Final = tuple(t.name for t in SERVED)
# Reader features whose data a plain Parquet scan of the file list would get wrong.
_UNSUPPORTED_FEATURES: Final = frozenset({"deletionVectors", "columnMapping"})
# Table versions read for as-of snapshots, kept for the next requests of that moment (a version
# never changes; reading one replays its log: tens of ms).
_PAST_VERSIONS: Final = 32
# The tables that change every second (the speed job commits one per micro-batch): their logs
# are looked at every ``refresh_s``; the others' every ``seldom_s``.
OFTEN: Final = frozenset({"speed/ctr"})
# A client's wish for newer versions than a replica has makes it look at those tables' logs at
# once, at most this often (seconds) per table: a client cannot make it list logs nonstop.
_CATCH_UP_S: Final = 0.1


class BehindError(ServingError, RuntimeError):
    """The lake's tables are not (yet) at versions a client has already seen: another
    replica read newer ones than this one can find (a 503: ask again)."""


class UnsupportedTableError(ServingError, RuntimeError):
    """A table uses a Delta feature the serving layer cannot read (deletion vectors, ...)."""


class AsOfError(ServingError, ValueError):
    """The lake cannot be read as of the moment asked: it is before the lake's first commit or
    in the future, or a table's version of then was removed (log cleanup or vacuum)."""


@dataclass(frozen=True)
class TableSnapshot:
    """One version of one table: its data files, or ``version=None`` if it does not exist."""

    name: str
    path: str
    version: int | None
    files: tuple[str, ...]
    partition_columns: tuple[str, ...]
    schema: pa.Schema = field(compare=False)

    @property
    def exists(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class LakeSnapshot:
    """A consistent view of the lake: one pinned version per table, plus the speed status."""

    tables: Mapping[str, TableSnapshot]
    status: SpeedStatus | None
    # Where the tables' files are (a local lake: never asked): the SQL sandbox's workers read
    # them with it.
    store: ObjectStoreSettings
    status_stamp: tuple[int, int] | None = None

    def __getitem__(self, table: str | Table) -> TableSnapshot:
        """A table's snapshot, by the catalog's :class:`~lake.catalog.Table` or its name."""
        return self.tables[table if isinstance(table, str) else table.name]

    @property
    def key(self) -> tuple[object, ...]:
        """Identifies the snapshot's content: equal keys, equal answers."""
        return (*((n, t.version) for n, t in sorted(self.tables.items())), self.status_stamp)

    def versions(self) -> dict[str, int | None]:
        return {name: table.version for name, table in self.tables.items()}

    def behind(self, wanted: Mapping[str, int]) -> list[str]:
        """The tables of ``wanted`` (name to version) this snapshot holds at older versions
        (or not at all); tables it does not serve are not its to answer for."""
        return sorted(
            name
            for name, version in wanted.items()
            if name in self.tables and _version(self.tables[name].version) < version
        )


def key_covers(key: object, wanted: Mapping[str, int]) -> bool:
    """Whether the snapshot of :attr:`LakeSnapshot.key` ``key`` holds every table of
    ``wanted`` at its version or a newer one (an answer computed on it is not older)."""
    if not wanted:
        return True
    if not isinstance(key, tuple):
        return False
    versions = {p[0]: p[1] for p in key if isinstance(p, tuple) and len(p) == 2}
    return all(
        _version(versions[name]) >= version for name, version in wanted.items() if name in versions
    )


def _version(version: object) -> int:
    return version if isinstance(version, int) else -1


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
        if refresh_s < 0:
            raise ValueError(f"'refresh_s' must be >= 0, got {refresh_s}")
        if seldom_s is not None and seldom_s < 0:
            raise ValueError(f"'seldom_s' must be >= 0, got {seldom_s}")
        if max_stale_s < 0:
            raise ValueError(f"'max_stale_s' must be >= 0, got {max_stale_s}")
        unknown = set(tables) - set(SCHEMAS)
        if unknown:
            raise ValueError(f"'tables' names unknown tables: {sorted(unknown)}")
        self.lake = lake
        self.tables = tables
        self.refresh_s = refresh_s
        self.seldom_s = (
            refresh_s if seldom_s is None or refresh_s == 0 else max(seldom_s, refresh_s)
        )
        self.max_stale_s = max_stale_s
        self.keep_current_s = keep_current_s
        self.background_refreshes = 0
        # Object-store requests (local stats and reads on a local lake) by kind: "commit" (a
        # look for a table's next commit, found or not), "reload" (a table read whole by
        # delta-rs: a few requests each), "exists" (a table not created yet looked for),
        # "status" (the speed job's status: a stat, and a read when it changed).
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
        self._past: OrderedDict[tuple[str, int], TableSnapshot] = OrderedDict()
        # On an object store each table's log is a round trip (a listing from its version):
        # the tables are read side by side (python -m bench storage, a new snapshot of 11
        # tables: 48 ms, then 17 ms with the missing ones checked through pyarrow).
        self._readers = (
            ThreadPoolExecutor(max_workers=len(tables), thread_name_prefix="snapshot-table")
            if lake.on_object_store and tables
            else None
        )
        self._past_lock = threading.Lock()

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
        looked at now. :class:`BehindError` if they are still older (not committed yet as far
        as this process can see, or looked at less than 0.1 s ago)."""
        snapshot = self.current()
        behind = snapshot.behind(wanted)
        if not behind:
            return snapshot
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
            if not _log_exists(path, self.lake.object_store):
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
        return _table_snapshot(name, path, handle)

    # -- as of a moment -------------------------------------------------------------------------

    def at(self, moment: dt.datetime) -> LakeSnapshot:
        """The lake as of ``moment``: every table at its last version committed at or before it
        (``version=None``: first committed later), without the speed status (not versioned).

        Never kept as the current snapshot (the table versions read are kept for the next
        requests of the moment). Commit times are those of :mod:`serving_layer.delta_log`.
        Raises :class:`AsOfError`.
        """
        if moment.tzinfo is None:
            raise ValueError(f"'moment' must be timezone-aware, got {moment.isoformat()}")
        if moment > dt.datetime.now(dt.UTC):
            raise AsOfError(f"{_iso(moment)} is in the future")
        moment_ns = (moment - EPOCH) // dt.timedelta(microseconds=1) * 1000
        current = self._current
        tables = {}
        first_commits = []
        for name in self.tables:
            path = self.lake.table(name)
            log = log_of(path, self.lake.object_store)
            hint = current.tables[name].version if current is not None else None
            span = log_span(log, hint)
            if span is None:
                tables[name] = TableSnapshot(name, path, None, (), (), SCHEMAS[name])
                continue
            first, last = span
            if first == 0 and (created := commit_ns(log, 0)) is not None:
                first_commits.append(created)
            version = version_at(log, moment_ns, first, last)
            if version is None and first == 0:
                tables[name] = TableSnapshot(name, path, None, (), (), SCHEMAS[name])
            elif version is None:
                raise AsOfError(
                    f"{name} cannot be read as of {_iso(moment)}: its log was cleaned up "
                    f"(retention){_readable_from(self.lake, name, log, first, last)}"
                )
            elif current is not None and current.tables[name].version == version:
                tables[name] = current.tables[name]
            else:
                tables[name] = self._table_at(name, log, version, last, moment)
        if not any(table.exists for table in tables.values()):
            since = f" ({_commit_iso(min(first_commits))})" if first_commits else ", none yet"
            raise AsOfError(f"{_iso(moment)} is before the lake's first commit{since}")
        return LakeSnapshot(tables=tables, status=None, store=self.lake.object_store)

    def _table_at(
        self, name: str, log: DeltaLog, version: int, last: int, moment: dt.datetime
    ) -> TableSnapshot:
        path = self.lake.table(name)
        with self._past_lock:
            table = self._past.get((name, version))
            if table is not None:
                self._past.move_to_end((name, version))
        try:
            if table is None:
                handle = open_delta(path, self.lake.object_store, version=version)
                table = _table_snapshot(name, path, handle)
        except DeltaError:
            removed = "its log was cleaned up"
        else:
            if _files_exist(table, self.lake.object_store):
                with self._past_lock:
                    self._past[(name, version)] = table
                    while len(self._past) > _PAST_VERSIONS:
                        self._past.popitem(last=False)
                return table
            removed = "its data files were vacuumed"
        raise AsOfError(
            f"{name} version {version}, its version at {_iso(moment)}, cannot be read: {removed} "
            f"(retention){_readable_from(self.lake, name, log, version + 1, last)}"
        )


def _readable_from(lake: LakeSettings, name: str, log: DeltaLog, low: int, high: int) -> str:
    """``; <name> can be read as of <time> or later``: the commit time of the first version
    of ``low..high`` whose log and files are there ("" if none is)."""
    path = lake.table(name)

    def readable(version: int) -> bool:
        try:
            handle = open_delta(path, lake.object_store, version=version)
            return _files_exist(_table_snapshot(name, path, handle), lake.object_store)
        except DeltaError:
            return False

    # Retention removes versions from the oldest on: the readable ones are the newest.
    if high < low or not readable(high):
        return ""
    committed = commit_ns(log, first_true(readable, low, high))
    return f"; {name} can be read as of {_commit_iso(committed)} or later" if committed else ""


def _table_snapshot(name: str, path: str, handle: DeltaTable) -> TableSnapshot:
    version = handle.version()
    features = set(handle.protocol().reader_features or ())
    if features & _UNSUPPORTED_FEATURES:
        raise UnsupportedTableError(
            f"{name} (version {version}) uses Delta reader feature(s) "
            f"{sorted(features & _UNSUPPORTED_FEATURES)}, which the serving layer cannot read"
        )
    return TableSnapshot(
        name=name,
        path=path,
        version=version,
        files=tuple(handle.file_uris()),
        partition_columns=tuple(handle.metadata().partition_columns),
        schema=pa.schema(handle.schema().to_arrow()),
    )


def _log_exists(path: str, store: ObjectStoreSettings) -> bool:
    """Whether the table at ``path`` has a log yet: its first commit, or a checkpoint once
    that was cleaned up. Two stats through pyarrow, which releases the GIL while it waits (an
    object store's round trips overlap across tables); delta-rs' is_deltatable holds it."""
    log = log_of(path, store)
    if commit_ns(log, 0) is not None:
        return True
    info = log.filesystem.get_file_info(f"{log.path}/_last_checkpoint")
    return bool(info.type != pafs.FileType.NotFound)


def _files_exist(table: TableSnapshot, store: ObjectStoreSettings) -> bool:
    if not table.files:
        return True
    filesystem, _ = arrow_filesystem(table.path, store)
    paths = [store_path(f) for f in table.files]
    return all(info.type != pafs.FileType.NotFound for info in filesystem.get_file_info(paths))


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _commit_iso(ns: int) -> str:
    # Rounded up to the microsecond: as of the time printed, the commit is there.
    return _iso(EPOCH + dt.timedelta(microseconds=-(-ns // 1000)))
