"""access/keys: the API's keys, an append-only Delta table of events — ``created``, ``revoked``,
``used`` — like the view registry (:mod:`lake.registry`).

A key is ``ctr_`` and 32 random bytes (URL-safe base64), shown once when it is created; the
table holds its SHA-256 only, so a copy of the lake grants nothing. A name has one key at a
time: it gets a new key only after its key was revoked (the old one stays refused). A key
verifies while it is neither revoked nor expired (:meth:`KeyRing.verify`).

The API checks a key on every request, so that check is cheap and never misses a revoke:
:class:`KeyWatcher` keeps the keys of one table version and, per call, one file stat (does the
next version's log file exist?) says whether to read them again. A revoke, by ``ctr keys
revoke`` in any process sharing the lake, takes effect at the API's next request. Last uses are
kept in memory by :class:`UsageRecorder` and committed at most once a minute per API process.

Written and read with delta-rs, on a local lake or on an object store (:mod:`lake.storage`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal, cast

import pyarrow as pa
import pyarrow.fs as pafs

from events.model import id_problem
from lake.catalog import API_KEYS
from lake.settings import LakeSettings
from lake.storage import arrow_filesystem, delta_options, is_delta, open_delta
from views.access import ROLES, Access, Role, Scope, ScopeError

log = logging.getLogger("ctr.keys")

Status = Literal["active", "expired", "revoked"]
PREFIX: Final = "ctr_"
NAME: Final = re.compile(r"[A-Za-z0-9._@-]{1,64}")
# Events at the same microsecond: a key is created, then used, then revoked.
_ORDER: Final = {"created": 0, "used": 1, "revoked": 2}
_TICK: Final = dt.timedelta(microseconds=1)


class KeyStoreError(ValueError):
    """A key change that cannot be: ``parameter`` names the argument that is wrong."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


@dataclass(frozen=True)
class ApiKey:
    """A name's key: what it grants and when it was created, expires, was revoked and last
    used. Never the key itself: its SHA-256 (:func:`hash_key`)."""

    name: str
    role: Role
    scope: Scope | None
    key_hash: str
    created_at: dt.datetime
    expires_at: dt.datetime | None = None
    revoked_at: dt.datetime | None = None
    last_used_at: dt.datetime | None = None

    @property
    def access(self) -> Access:
        return Access(self.name, self.role, self.scope)

    def status(self, now: dt.datetime) -> Status:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


def hash_key(key: str) -> str:
    """The SHA-256 hex digest of ``key``: what the table holds of it."""
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Each name's latest key, with its revoke and last use applied."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self._by_name = {k.name: k for k in keys}
        self._by_hash = {k.key_hash: k for k in self._by_name.values() if k.revoked_at is None}

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, object]]) -> KeyRing:
        """The keys the table's rows (in any order) describe, their events taken by time."""
        keys: dict[str, ApiKey] = {}
        for row in sorted(rows, key=lambda r: (_utc(r["at"]), _ORDER.get(str(r["event"]), 3))):
            name, at = str(row["name"]), _utc(row["at"])
            key = keys.get(name)
            if row["event"] == "created":
                # Over a key not revoked, only when two creates raced (create_key tells the
                # loser): the first stands.
                if key is None or key.revoked_at is not None:
                    keys[name] = _created(row)
            elif key is None or key.revoked_at is not None:
                continue
            elif row["event"] == "revoked":
                keys[name] = replace(key, revoked_at=at)
            elif row["event"] == "used" and (key.last_used_at is None or at > key.last_used_at):
                keys[name] = replace(key, last_used_at=at)
        return cls(keys.values())

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """Every name's latest key (revoked and expired ones too), by name."""
        return tuple(self._by_name[name] for name in sorted(self._by_name))

    def get(self, name: str) -> ApiKey | None:
        return self._by_name.get(name)

    def verify(self, key: str, now: dt.datetime) -> ApiKey | None:
        """The key presented as ``key`` if it is known, not revoked and not expired at
        ``now``; None otherwise."""
        presented = hash_key(key)
        found = self._by_hash.get(presented)
        if found is None or not secrets.compare_digest(found.key_hash, presented):
            return None
        return found if found.status(now) == "active" else None


def read_keys(lake: LakeSettings) -> KeyRing:
    """The keys as they are now (none before the first is created)."""
    return _read(API_KEYS.path(lake))[1]


def create_key(  # noqa: PLR0913 - keyword-only options, each with a default
    lake: LakeSettings,
    name: str,
    role: str,
    *,
    campaigns: Iterable[str] = (),
    ads: Iterable[str] = (),
    expires_at: dt.datetime | None = None,
    now: dt.datetime | None = None,
    allow_unknown: bool = False,
) -> tuple[ApiKey, str]:
    """A new key for ``name`` (one commit): what it grants, and the key itself, which is not
    stored (its SHA-256 is) and cannot be shown again. Refused while ``name`` has a key that
    was not revoked, expired or not.

    An advertiser's ids must be ids the event contract allows, kept exactly as given (spaces
    are part of an id), and, unless ``allow_unknown`` (a campaign that has not started yet),
    ids the lake's views have had rows of recently (:func:`lake.scope_ids.unseen_ids`)."""
    now = _now(now)
    access = _access(name, role, campaigns, ads)
    if access.scope is not None and not allow_unknown:
        _require_seen(lake, access.scope, now)
    if expires_at is not None:
        expires_at = _aware(expires_at, "expires_at")
        if expires_at <= now:
            raise KeyStoreError("expires_at", f"must be in the future, got {_show(expires_at)}")
    current = read_keys(lake).get(name)
    if current is not None and current.revoked_at is None:
        raise KeyStoreError(
            "name",
            f"{name!r} has a key already ({current.status(now)}, created "
            f"{_show(current.created_at)}); revoke it first",
        )
    # Events are taken in the order of their times: a new key comes after the old one's revoke
    # even when this machine's clock is behind the one that revoked it.
    at = (
        now
        if current is None or current.revoked_at is None
        else max(now, current.revoked_at + _TICK)
    )
    key = PREFIX + secrets.token_urlsafe(32)
    created = ApiKey(name, access.role, access.scope, hash_key(key), at, expires_at)
    scope = access.scope
    _append(
        lake,
        [
            {
                "name": name,
                "event": "created",
                "role": access.role,
                "campaigns": list(scope.campaigns) if scope else [],
                "ads": list(scope.ads) if scope else [],
                "key_hash": created.key_hash,
                "expires_at": expires_at,
                "at": at,
            }
        ],
    )
    stored = read_keys(lake).get(name)
    if stored is None or stored.key_hash != created.key_hash:
        raise KeyStoreError(
            "name", f"another key was created for {name!r} at the same time; this one is void"
        )
    return created, key


def revoke_key(
    lake: LakeSettings, name: str, *, reason: str = "", now: dt.datetime | None = None
) -> ApiKey:
    """Revoke ``name``'s key (one commit): refused from the API's next request on."""
    current = read_keys(lake).get(name)
    if current is None:
        raise KeyStoreError("name", f"no key is named {name!r}")
    if current.revoked_at is not None:
        raise KeyStoreError(
            "name", f"the key named {name!r} was revoked already ({_show(current.revoked_at)})"
        )
    # Never before the key's creation, whatever this machine's clock says: it would not count.
    at = max(_now(now), current.created_at)
    _append(lake, [{"name": name, "event": "revoked", "at": at, "reason": reason}])
    return replace(current, revoked_at=at)


def record_use(lake: LakeSettings, used: Mapping[str, dt.datetime]) -> None:
    """Record the last use of each key named in ``used`` (one commit; none if it is empty)."""
    if not used:
        return
    _append(
        lake,
        [{"name": n, "event": "used", "at": _aware(at, "used")} for n, at in used.items()],
    )


def fold_uses(lake: LakeSettings) -> int:
    """Drop the ``used`` events a later one of the same key supersedes (each API process
    records one a minute per key in use, which would grow the table, and each reload, without
    bound), in one commit that writes the table again; returns how many were dropped (0: no
    commit). Run by the maintenance DAG before it compacts the table. A create or revoke
    committed meanwhile is kept (tests/test_keys.py)."""
    from deltalake import write_deltalake

    path = API_KEYS.path(lake)
    if not is_delta(path):
        return 0
    table = open_delta(path)
    rows = table.to_pyarrow_table().to_pylist()
    unique, used = [], set()
    for row in sorted(rows, key=lambda r: _utc(r["at"]), reverse=True):
        if row["event"] == "used":
            if row["name"] in used:
                continue  # superseded by the newer use kept before it
            used.add(row["name"])
        unique.append(row)
    dropped = len(rows) - len(unique)
    if dropped:
        data = pa.Table.from_pylist(unique, schema=API_KEYS.schema)
        # Through the table as read: the overwrite removes the files of that version only, so
        # a revoke committed since (a file of its own) stays.
        write_deltalake(table, data, mode="overwrite")
    return dropped


@dataclass(frozen=True)
class _Loaded:
    version: int  # -1: no table yet
    ring: KeyRing
    at: float  # time.monotonic()


class KeyWatcher:
    """The keys as of the table's latest commit, for a check on every request.

    :meth:`ring` costs one file stat while nothing was committed: whether the log file of the
    version after the one read exists (a HEAD request on an object store,
    :attr:`check_is_remote`). A new commit (a create, a revoke, an API process's last uses, a
    compaction) reads the keys again. So does a ring older than ``max_age_s``: the log files of
    versions long past are cleaned up (``LAKE_HISTORY_RETENTION_HOURS``), after which the one
    the stat looks for could be gone. Errors (the store unreachable) are raised, never answered
    with the keys read before.
    """

    def __init__(self, lake: LakeSettings, *, max_age_s: float = 600.0) -> None:
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        self.path = API_KEYS.path(lake)
        self.max_age_s = max_age_s
        self.reloads = 0
        self._remote = lake.on_object_store
        self._filesystem, root = arrow_filesystem(self.path)
        self._log = f"{root}/_delta_log"
        self._loaded: _Loaded | None = None
        self._lock = threading.Lock()

    @property
    def check_is_remote(self) -> bool:
        """Whether :meth:`ring`'s check is a network round trip (the lake on an object store):
        call it from a thread, not an event loop."""
        return self._remote

    def ring(self) -> KeyRing:
        """The keys, read again only if the table has a commit they do not include."""
        seen = self._loaded
        if seen is not None and not self._stale(seen):
            return seen.ring
        with self._lock:
            loaded = self._loaded
            if loaded is seen:  # not read again by another thread meanwhile
                version, ring = _read(self.path)
                loaded = self._loaded = _Loaded(version, ring, time.monotonic())
                self.reloads += 1
            assert loaded is not None
            return loaded.ring

    def _stale(self, loaded: _Loaded) -> bool:
        if time.monotonic() - loaded.at >= self.max_age_s:
            return True
        # pyarrow, not delta-rs: it releases the GIL while it waits.
        info = self._filesystem.get_file_info(f"{self._log}/{loaded.version + 1:020d}.json")
        return bool(info.type != pafs.FileType.NotFound)


class UsageRecorder:
    """Last uses of keys: :meth:`touch` on each request (in memory), and a background thread
    that commits the latest use of each key touched every ``flush_s`` seconds (one commit, none
    when nothing was touched). A failed commit is logged and its uses wait for the next."""

    def __init__(self, lake: LakeSettings, flush_s: float = 60.0) -> None:
        if flush_s <= 0:
            raise ValueError(f"flush_s must be positive, got {flush_s}")
        self.lake = lake
        self.flush_s = flush_s
        self._touched: dict[str, dt.datetime] = {}
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="key-usage", daemon=True)
        self._thread.start()

    def touch(self, name: str, at: dt.datetime) -> None:
        """``name``'s key was used at ``at``."""
        _aware(at, "at")
        with self._lock:
            self._keep(name, at)

    def flush(self) -> None:
        """Commit the uses touched since the last flush."""
        with self._flushing:
            with self._lock:
                used, self._touched = self._touched, {}
            try:
                record_use(self.lake, used)
            except Exception:
                log.exception("recording %d key(s)' last use failed; next flush retries", len(used))
                with self._lock:
                    for name, at in used.items():
                        self._keep(name, at)

    def close(self) -> None:
        """Stop the background thread, and flush once more."""
        self._closed.set()
        self._thread.join()
        self.flush()

    def _keep(self, name: str, at: dt.datetime) -> None:
        last = self._touched.get(name)
        if last is None or at > last:
            self._touched[name] = at

    def _run(self) -> None:
        while not self._closed.wait(self.flush_s):
            self.flush()


def _read(path: str) -> tuple[int, KeyRing]:
    """The table's latest version (-1: no table yet) and its keys."""
    if not is_delta(path):
        return -1, KeyRing()
    table = open_delta(path)
    return table.version(), KeyRing.from_rows(table.to_pyarrow_table().to_pylist())


def _append(lake: LakeSettings, rows: list[dict[str, object]]) -> None:
    from deltalake import write_deltalake

    data = pa.Table.from_pylist(rows, schema=API_KEYS.schema)
    path = API_KEYS.path(lake)
    write_deltalake(path, data, mode="append", storage_options=delta_options(path))


def _access(name: str, role: str, campaigns: Iterable[str], ads: Iterable[str]) -> Access:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise KeyStoreError("name", f"1 to 64 letters, digits or any of . _ @ -, got {name!r}")
    if role not in ROLES:
        raise KeyStoreError("role", f"one of {', '.join(ROLES)}, got {role!r}")
    for argument, values in (("campaigns", campaigns), ("ads", ads)):
        if isinstance(values, str):
            raise KeyStoreError(argument, f"a sequence of ids, not the string {values!r}")
    campaigns, ads = tuple(campaigns), tuple(ads)
    if role != "advertiser" and (campaigns or ads):
        raise KeyStoreError(
            "campaigns" if campaigns else "ads",
            f"only an advertiser key is limited to campaigns or ads; an {role} key reads every "
            "campaign",
        )
    for argument, values, field in (("campaigns", campaigns, "campaign_id"), ("ads", ads, "ad_id")):
        for value in values:
            problem = id_problem(value, field)
            if problem is not None:
                raise KeyStoreError(argument, f"{_short(value)}: {problem.partition(': ')[2]}")
    try:
        scope = Scope.create(campaigns, ads) if role == "advertiser" else None
        return Access(name, cast(Role, role), scope)
    except ScopeError as exc:
        argument = {"campaign": "campaigns", "ad": "ads"}.get(exc.parameter, "role")
        raise KeyStoreError(argument, exc.message) from None


def _require_seen(lake: LakeSettings, scope: Scope, now: dt.datetime) -> None:
    from lake.scope_ids import unseen_ids

    unseen = unseen_ids(lake, scope.campaigns, scope.ads, now=now)
    if not unseen:
        return
    argument, ids, what = (
        ("campaigns", unseen.campaigns, "campaign")
        if unseen.campaigns
        else ("ads", unseen.ads, "ad of the key's campaigns")
    )
    raise KeyStoreError(
        argument,
        f"no {what} {', '.join(_short(i) for i in ids)} in the views' rows of the last "
        f"{unseen.days} days: ids are matched exactly (case and spaces included); for a "
        "campaign that has not started yet, create the key with --allow-unknown",
    )


def _short(value: object) -> str:
    """``value`` for an error message: repr'd, at most 80 characters of it."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}… ({len(str(value)):,} characters)"


def _created(row: Mapping[str, object]) -> ApiKey:
    role = cast(Role, str(row["role"]))
    campaigns = tuple(cast("list[str] | None", row["campaigns"]) or ())
    ads = tuple(cast("list[str] | None", row["ads"]) or ())
    expires_at = row["expires_at"]
    return ApiKey(
        str(row["name"]),
        role,
        Scope(campaigns, ads) if role == "advertiser" else None,
        str(row["key_hash"]),
        _utc(row["at"]),
        None if expires_at is None else _utc(expires_at),
    )


def _utc(value: object) -> dt.datetime:
    assert isinstance(value, dt.datetime)
    return value.astimezone(dt.UTC)


def _aware(value: dt.datetime, argument: str) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise KeyStoreError(argument, f"a datetime with a time zone, got {value!r}")
    return value.astimezone(dt.UTC)


def _now(now: dt.datetime | None) -> dt.datetime:
    return dt.datetime.now(dt.UTC) if now is None else _aware(now, "now")


def _show(moment: dt.datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
