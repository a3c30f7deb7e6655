"""The keys of ``access/keys``, in memory: each name's latest key, with its revoke and last
use applied, from the table's events (``created``, ``revoked``, ``used``).

A key is checked by its SHA-256 (:func:`hash_key`), the only thing the table holds of it. A key
verifies while it is neither revoked nor expired (:meth:`KeyRing.verify`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal, cast

from access.roles import Access, Role, Scope

Status = Literal["active", "expired", "revoked"]
# Events at the same microsecond: a key is created, then used, then revoked.
_ORDER: Final = {"created": 0, "used": 1, "revoked": 2}


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
