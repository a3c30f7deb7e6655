"""access/keys: the API's keys, an append-only Delta table of events — ``created``, ``revoked``,
``used`` — like the view registry (:mod:`lake.registry`).

A key is ``ctr_`` and 32 random bytes (URL-safe base64), shown once when it is created; the
table holds its SHA-256 only (:mod:`access.key_ring`), so a copy of the lake grants nothing. A
name has one key at a time: it gets a new key only after its key was revoked (the old one stays
refused). The API reads the table through :class:`access.key_watcher.KeyWatcher` and records
last uses through :class:`access.key_usage.UsageRecorder`.

Written and read with delta-rs, on a local lake or on an object store (:mod:`lake.storage`).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Final, cast

import pyarrow as pa

from access.errors import AccessError
from access.key_ring import ApiKey, KeyRing, hash_key
from access.roles import ROLES, Access, Role, Scope, ScopeError
from events.model import id_problem
from lake.catalog import API_KEYS
from lake.settings import LakeSettings
from lake.storage import delta_options, is_delta, open_delta
from runtime.errors import BadArgumentError
from runtime.object_store import ObjectStoreSettings

PREFIX: Final = "ctr_"
NAME: Final = re.compile(r"[A-Za-z0-9._@-]{1,64}")
_TICK: Final = dt.timedelta(microseconds=1)


class KeyStoreError(AccessError, BadArgumentError):
    """A key change that cannot be: ``parameter`` names the argument that is wrong."""


def read_keys(lake: LakeSettings) -> KeyRing:
    """The keys as they are now (none before the first is created)."""
    return read_keys_and_version(API_KEYS.path(lake), lake.object_store)[1]


def read_keys_and_version(path: str, store: ObjectStoreSettings) -> tuple[int, KeyRing]:
    """The latest version of the table at ``path`` (-1: no table yet) and its keys."""
    if not is_delta(path, store):
        return -1, KeyRing()
    table = open_delta(path, store)
    return table.version(), KeyRing.from_rows(table.to_pyarrow_table().to_pylist())


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
    ids the lake's views have had rows of recently (:func:`access.scope_ids.unseen_ids`)."""
    now = _now(now)
    access = _access(name, role, campaigns, ads)
    if access.scope is not None and not allow_unknown:
        _require_seen(lake, access.scope, now)
    if expires_at is not None:
        expires_at = checked_utc(expires_at, "expires_at")
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
        [{"name": n, "event": "used", "at": checked_utc(at, "used")} for n, at in used.items()],
    )


def checked_utc(value: dt.datetime, argument: str) -> dt.datetime:
    """``value`` in UTC; KeyStoreError naming ``argument`` if it has no time zone."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise KeyStoreError(argument, f"a datetime with a time zone, got {value!r}")
    return value.astimezone(dt.UTC)


def _append(lake: LakeSettings, rows: list[dict[str, object]]) -> None:
    from deltalake import write_deltalake

    data = pa.Table.from_pylist(rows, schema=API_KEYS.schema)
    path = API_KEYS.path(lake)
    options = delta_options(path, lake.object_store)
    write_deltalake(path, data, mode="append", storage_options=options)


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
    from access.scope_ids import unseen_ids

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


def _now(now: dt.datetime | None) -> dt.datetime:
    return dt.datetime.now(dt.UTC) if now is None else checked_utc(now, "now")


def _show(moment: dt.datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
