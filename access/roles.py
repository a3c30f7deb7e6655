"""Who may read what: the three roles of an API key and an advertiser's scope of campaigns.

- ``admin``: everything, the raw tables (events with user ids, rejected payloads) and
  ``/metrics`` included;
- ``analyst``: every campaign's views (CTR, coverage, drift, arrivals per minute), no raw
  events;
- ``advertiser``: the views' rows of its campaigns (and, when the scope names ads, of those ads
  only), nothing computed over other rows.

A scope is a predicate on view rows' dimensions, so every reader applies the same one: the
serving layer's CTR query, the SQL sandbox's views, the dashboard's answers.
Engine-free: the API, the CLI and the key store read it without importing Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from access.errors import AccessError
from runtime.errors import BadArgumentError

Role = Literal["admin", "analyst", "advertiser"]
ROLES: Final = get_args(Role)
MAX_SCOPE_VALUES: Final = 1000


class ScopeError(AccessError, BadArgumentError):
    """A scope or an access that cannot be: ``parameter`` names what is wrong."""


@dataclass(frozen=True)
class Scope:
    """The rows an advertiser sees: ``campaign_id`` in ``campaigns`` and, when ``ads`` is not
    empty, ``ad_id`` in ``ads``. Build it with :meth:`create` (sorted, distinct, checked)."""

    campaigns: tuple[str, ...]
    ads: tuple[str, ...] = ()

    @classmethod
    def create(cls, campaigns: Iterable[str], ads: Iterable[str] = ()) -> Scope:
        pinned = {}
        for name, values in (("campaign", campaigns), ("ad", ads)):
            # Ids as the events carry them: spaces are part of an id, never stripped.
            unique = tuple(sorted(set(values)))
            if any(not v for v in unique):
                raise ScopeError(name, "an id must not be empty")
            if len(unique) > MAX_SCOPE_VALUES:
                raise ScopeError(name, f"at most {MAX_SCOPE_VALUES} ids, got {len(unique)}")
            pinned[name] = unique
        if not pinned["campaign"]:
            raise ScopeError("campaign", "an advertiser's scope needs at least one campaign id")
        return cls(pinned["campaign"], pinned["ad"])

    def admits(self, dimensions: Mapping[str, object]) -> bool:
        """Whether a row with these dimension values is in the scope."""
        if dimensions.get("campaign_id") not in self.campaigns:
            return False
        return not self.ads or dimensions.get("ad_id") in self.ads

    def sql(self, alias: str = "") -> tuple[str, dict[str, object]]:
        """A DuckDB condition on the rows of ``alias`` (a trusted name, or none) and its bound
        parameters (``$scope_campaign_N``, ``$scope_ad_N``); values never enter the SQL text."""
        prefix = f"{alias}." if alias else ""
        params: dict[str, object] = {}
        conditions = []
        for column, name, values in (
            ("campaign_id", "scope_campaign", self.campaigns),
            ("ad_id", "scope_ad", self.ads),
        ):
            if not values:
                continue
            names = []
            for i, value in enumerate(values):
                params[f"{name}_{i}"] = value
                names.append(f"${name}_{i}")
            conditions.append(f"{prefix}{column} IN ({', '.join(names)})")
        return " AND ".join(conditions), params

    def describe(self) -> str:
        text = "campaigns " + ", ".join(self.campaigns)
        return text + (f"; ads {', '.join(self.ads)}" if self.ads else "")


@dataclass(frozen=True)
class Access:
    """Who sent a request: the key's name (never the key), its role and, for an advertiser, its
    scope."""

    name: str
    role: Role
    scope: Scope | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ScopeError("scope", f"must be one of {', '.join(ROLES)}, got {self.role!r}")
        if (self.role == "advertiser") != (self.scope is not None):
            raise ScopeError(
                "scope",
                "an advertiser key needs campaign ids; admin and analyst keys take none",
            )

    @property
    def raw_tables(self) -> bool:
        """Whether it may read the raw tables (events, rejected)."""
        return self.role == "admin"

    @property
    def sees_everything(self) -> bool:
        """Whether it reads every campaign's rows (admin, analyst)."""
        return self.scope is None


BOOTSTRAP: Final = Access("API_TOKEN", "admin")
