"""A CTR query: its parameters, validated (the SQL it becomes is :mod:`serving_layer.ctr_sql`'s)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from access.roles import Scope
from events.countries import ISO_3166_ALPHA2
from runtime.errors import BadArgumentError
from runtime.times import EARLIEST, EPOCH, LATEST
from serving_layer.errors import ServingError
from views.columns import DIMENSIONS
from views.columns import MEASURES as COUNTS

# ``all``: one bucket spanning the query's range (a total per group, Druid's "granularity: all").
Granularity = Literal["minute", "hour", "day", "all"]
GRANULARITIES: Final = get_args(Granularity)
STEP: Final[Mapping[str, dt.timedelta]] = {
    "minute": dt.timedelta(minutes=1),
    "hour": dt.timedelta(hours=1),
    "day": dt.timedelta(days=1),
}
# What a query may order by besides the bucket and the grouped dimensions: the counts of every
# version (views.columns.MEASURES; null attribution counts sort last) and the CTR.
MEASURES: Final = (*COUNTS, "ctr")
MAX_FILTER_VALUES: Final = 100
# The times a query may name: events carry epoch milliseconds, and a year-9999 bound leaves
# room to round up to the minute and add a day without leaving the calendar.
DEFAULT_RANGE: Final = dt.timedelta(hours=24)


class QueryError(ServingError, BadArgumentError):
    """A query parameter is invalid; ``parameter`` names it."""


@dataclass(frozen=True)
class OrderKey:
    column: str
    descending: bool = False

    def __str__(self) -> str:
        return f"-{self.column}" if self.descending else self.column


@dataclass(frozen=True)
class QueryLimits:
    """What one query may ask for: the longest range and the most rows."""

    max_range: dt.timedelta = dt.timedelta(days=31)
    max_limit: int = 100_000

    def check(self, query: CtrQuery) -> CtrQuery:
        """``query`` if it stays within these limits, else the :class:`QueryError` naming the
        parameter."""
        if query.end - query.start > self.max_range:
            raise QueryError(
                "end",
                f"range {query.end - query.start} is too large: at most {self.max_range} per "
                "query; narrow start/end",
            )
        if not 1 <= query.limit <= self.max_limit:
            raise QueryError("limit", f"must be between 1 and {self.max_limit}, got {query.limit}")
        return query


@dataclass(frozen=True)
class CtrQuery:
    """Impressions, clicks and CTR per time bucket and dimension group over [start, end).

    Times lie in [:data:`EARLIEST`, :data:`LATEST`]; without ``start``, the range is the
    :data:`DEFAULT_RANGE` before ``end``.

    A minute bucket belongs to the query when its start lies in [start, end); both bounds are
    rounded up to the minute (which selects the same buckets), so equal queries share a cache
    entry. Buckets are UTC minutes, hours or days, or with ``granularity="all"`` one bucket
    [start, end) per group. Build it with :meth:`create`, which validates every parameter.
    """

    start: dt.datetime
    end: dt.datetime
    granularity: Granularity = "hour"
    group_by: tuple[str, ...] = ()
    filters: tuple[tuple[str, tuple[str, ...]], ...] = ()
    order_by: tuple[OrderKey, ...] = ()
    limit: int = 10_000
    # An advertiser's campaigns: rows outside it are not read at all (the filters narrow it
    # further; a filter outside it selects nothing).
    scope: Scope | None = None
    # Also who each row reached (serving_layer.reach): distinct users, a count over every user
    # id of the range's batch rows, so asked for, not given to every query.
    reach: bool = False

    @classmethod
    def create(  # noqa: PLR0913 - keyword-only parameters of a query
        cls,
        *,
        start: dt.datetime | None,
        end: dt.datetime,
        granularity: str = "hour",
        group_by: str | Sequence[str] = (),
        filters: Mapping[str, Sequence[str]] | None = None,
        order_by: str | Sequence[str] = (),
        limit: int = 10_000,
        scope: Scope | None = None,
        reach: bool = False,
    ) -> CtrQuery:
        """The query, every parameter checked but the deployment's bounds on range and rows,
        which :meth:`QueryLimits.check` applies. ``group_by`` and ``order_by`` may be given as
        the API takes them: one comma-separated string."""
        start, end = _range(start, end)
        groups = _group_by(_names(group_by))
        query = cls(
            start=start,
            end=end,
            granularity=_granularity(granularity),
            group_by=groups,
            filters=_filters(filters or {}),
            order_by=_order_by(_names(order_by), groups),
            limit=limit,
            scope=scope,
            reach=reach,
        )
        if limit < 1:
            raise QueryError("limit", f"must be at least 1, got {limit}")
        return query

    @property
    def step(self) -> dt.timedelta:
        """The length of a bucket (``all``: the whole range)."""
        return self.end - self.start if self.granularity == "all" else STEP[self.granularity]

    def bucket(self, start: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        """The part of the bucket starting at ``start`` that lies in the query's range."""
        return max(start, self.start), min(start + self.step, self.end)

    def whole_buckets(
        self, intervals: Sequence[tuple[dt.datetime, dt.datetime]]
    ) -> list[tuple[dt.datetime, dt.datetime]]:
        """The parts of the range made of whole buckets (as :meth:`bucket` clips them to the
        range) that lie in ``intervals`` (disjoint, in order), in order, adjacent ones joined."""
        joined: list[tuple[dt.datetime, dt.datetime]] = []
        for start, end in intervals:
            lo, hi = max(start, self.start), min(end, self.end)
            if lo >= hi:
                continue
            if joined and joined[-1][1] >= lo:
                joined[-1] = (joined[-1][0], max(joined[-1][1], hi))
            else:
                joined.append((lo, hi))
        parts = []
        for lo, hi in joined:
            first = lo if lo == self.start else self._boundary(lo, up=True)
            last = hi if hi == self.end else self._boundary(hi, up=False)
            if first < last:
                parts.append((first, last))
        return parts

    def _boundary(self, moment: dt.datetime, *, up: bool) -> dt.datetime:
        """The bucket boundary at or after (``up``) or at or before ``moment``: whole multiples
        of the bucket's length since the epoch (``all``: the range's end or start)."""
        if self.granularity == "all":
            return self.end if up else self.start
        step = self.step
        floor = EPOCH + (moment - EPOCH) // step * step
        return floor + step if up and floor != moment else floor


def _names(value: str | Sequence[str]) -> Sequence[str]:
    """Names as given, or a comma-separated string's (blanks dropped)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _range(start: dt.datetime | None, end: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    end = _minute_ceil(_utc(end, "end"))
    if start is None:
        start = max(end - DEFAULT_RANGE, EARLIEST)
    start = _minute_ceil(_utc(start, "start"))
    if end <= start:
        raise QueryError("end", f"must be after start ({end.isoformat()} <= {start.isoformat()})")
    return start, end


_GRANULARITY: Final[Mapping[str, Granularity]] = {g: g for g in GRANULARITIES}


def _granularity(value: str) -> Granularity:
    if value in _GRANULARITY:
        return _GRANULARITY[value]
    raise QueryError("granularity", f"must be one of {', '.join(GRANULARITIES)}, got {value!r}")


def _group_by(names: Sequence[str]) -> tuple[str, ...]:
    for name in names:
        if name not in DIMENSIONS:
            raise QueryError(
                "group_by", f"unknown dimension {name!r}; one of: {', '.join(DIMENSIONS)}"
            )
    return tuple(dict.fromkeys(names))  # first occurrence of each, in order


def _filters(filters: Mapping[str, Sequence[str]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    pinned = []
    for name, values in sorted(filters.items()):
        if name not in DIMENSIONS:
            raise QueryError(name, f"unknown dimension; one of: {', '.join(DIMENSIONS)}")
        unique = tuple(sorted(set(values)))
        if name == "country":
            _check_countries(unique)
        if len(unique) > MAX_FILTER_VALUES:
            raise QueryError(name, f"at most {MAX_FILTER_VALUES} values, got {len(unique)}")
        if unique:
            pinned.append((name, unique))
    return tuple(pinned)


def _check_countries(values: Sequence[str]) -> None:
    """Country codes as the events carry them (two upper-case letters, ISO 3166-1 alpha-2):
    ``us`` would select nothing, silently. A well-formed code no event has (``XX``) selects
    nothing, as an unknown campaign does."""
    for value in values:
        if not (len(value) == 2 and value.isascii() and value.isalpha() and value.isupper()):
            hint = f" (did you mean {value.upper()!r}?)" if value.upper() in ISO_3166_ALPHA2 else ""
            raise QueryError(
                "country",
                f"must be ISO 3166-1 alpha-2 codes in upper case like 'US', got {value!r}{hint}",
            )


def _order_by(raw_keys: Sequence[str], groups: Sequence[str]) -> tuple[OrderKey, ...]:
    allowed = ("bucket_start", *groups, *MEASURES)
    keys = []
    for raw in raw_keys:
        key = OrderKey(raw[1:], True) if raw.startswith("-") else OrderKey(raw)
        if key.column not in allowed:
            hint = " (group by it first)" if key.column in DIMENSIONS else ""
            raise QueryError(
                "order_by",
                f"cannot order by {key.column!r}{hint}; one of: {', '.join(allowed)}, "
                "with a leading '-' for descending",
            )
        keys.append(key)
    return tuple(keys)


def _utc(value: dt.datetime, name: str) -> dt.datetime:
    """``value`` in UTC, within [EARLIEST, LATEST]."""
    if value.tzinfo is None:
        raise QueryError(name, f"must carry a UTC offset, got {value.isoformat()}")
    try:
        utc = value.astimezone(dt.UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise QueryError(
            name,
            f"must be between {_iso(EARLIEST)} and {_iso(LATEST)}, got {value.isoformat()}",
        )
    return utc


def _iso(value: dt.datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _minute_ceil(value: dt.datetime) -> dt.datetime:
    floor = value.replace(second=0, microsecond=0)
    return floor if floor == value else floor + dt.timedelta(minutes=1)
