"""A CTR query: validated parameters, and the DuckDB SQL that answers it with bound values.

Only identifiers from fixed allow-lists (the dimensions, the measures, the registered table
names) are written into the SQL text; every value a user sent travels as a bound parameter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from lake.coverage import in_intervals_sql
from views.columns import DIMENSIONS

# ``all``: one bucket spanning the query's range (a total per group, Druid's "granularity: all").
Granularity = Literal["minute", "hour", "day", "all"]
GRANULARITIES: Final = get_args(Granularity)
STEP: Final[Mapping[str, dt.timedelta]] = {
    "minute": dt.timedelta(minutes=1),
    "hour": dt.timedelta(hours=1),
    "day": dt.timedelta(days=1),
}
MEASURES: Final = ("impressions", "clicks", "ctr")
MAX_FILTER_VALUES: Final = 100
# The times a query may name: events carry epoch milliseconds, and a year-9999 bound leaves
# room to round up to the minute and add a day without leaving the calendar.
EARLIEST: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST: Final = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
DEFAULT_RANGE: Final = dt.timedelta(hours=24)


class QueryError(ValueError):
    """A query parameter is invalid; ``parameter`` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


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

    @classmethod
    def create(
        cls,
        *,
        start: dt.datetime | None,
        end: dt.datetime,
        granularity: str = "hour",
        group_by: Sequence[str] = (),
        filters: Mapping[str, Sequence[str]] | None = None,
        order_by: Sequence[str] = (),
        limit: int = 10_000,
    ) -> CtrQuery:
        """The query, every parameter checked but the deployment's bounds on range and rows,
        which :meth:`QueryLimits.check` applies."""
        start, end = _range(start, end)
        groups = _group_by(group_by)
        query = cls(
            start=start,
            end=end,
            granularity=_granularity(granularity),
            group_by=groups,
            filters=_filters(filters or {}),
            order_by=_order_by(order_by, groups),
            limit=limit,
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


# Up to this many covered intervals in a query's range become a range predicate (fast, pushed
# into the Parquet scan); beyond it the query as-of joins the covered-interval table.
MAX_PREDICATE_INTERVALS: Final = 64


def ctr_sql(
    query: CtrQuery,
    *,
    batch: str,
    speed: str,
    covered: str,
    stale: str | None = None,
    intervals: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
) -> tuple[str, dict[str, object]]:
    """SQL and bound parameters for ``query`` over registered relations.

    ``batch`` and ``speed`` hold base-view rows, ``covered`` the disjoint covered intervals
    (``interval_start``, ``interval_end``), ``stale`` the late arrivals no batch run has counted
    yet (rows of :func:`lake.staleness.stale_sql`, all in covered buckets). Per minute bucket the
    rule is: covered → batch rows plus its stale arrivals, else speed rows. ``intervals``, when
    given, are the same disjoint intervals as far as they meet the query's range (at most
    :data:`MAX_PREDICATE_INTERVALS`); they turn the rule into a range predicate instead of an
    as-of join. Columns: bucket_us (bucket start, microseconds since the epoch), the group_by
    dimensions, impressions, clicks, ctr, stale_events, run_ids. One row more than
    ``query.limit``, so the caller can tell a truncated answer.
    """
    params: dict[str, object] = {"start": query.start, "end": query.end}
    where = ["t.bucket_start >= $start", "t.bucket_start < $end"]
    for name, values in query.filters:
        placeholders = []
        for i, value in enumerate(values):
            params[f"{name}_{i}"] = value
            placeholders.append(f"${name}_{i}")
        where.append(f"t.{name} IN ({', '.join(placeholders)})")
    columns = ", ".join(["t.bucket_start", *(f"t.{d}" for d in query.group_by)])
    predicate = None
    if intervals is not None:
        if len(intervals) > MAX_PREDICATE_INTERVALS:
            raise ValueError(f"at most {MAX_PREDICATE_INTERVALS} 'intervals', got {len(intervals)}")
        bounds = []
        for i, (start, end) in enumerate(intervals):
            params[f"cov_start_{i}"], params[f"cov_end_{i}"] = start, end
            bounds.append((f"$cov_start_{i}", f"$cov_end_{i}"))
        predicate = in_intervals_sql("t.bucket_start", bounds)
    merged = _merge_rule(
        _Sides(batch, speed, covered, stale),
        columns=columns,
        where=where,
        predicate=predicate,
    )
    # Buckets as integer microseconds since the epoch: UTC minutes, hours and days are whole
    # multiples of their length, and integer division is far cheaper than date_trunc on a
    # TIMESTAMPTZ (which goes through the ICU calendar for every row). ``all`` is one bucket
    # starting at the range's start.
    if query.granularity == "all":
        params["start_us"] = int(query.start.timestamp()) * 1_000_000  # whole minutes
        bucket = "$start_us::BIGINT"
    else:
        params["step_us"] = query.step // dt.timedelta(microseconds=1)
        bucket = "(epoch_us(bucket_start) // $step_us) * $step_us"
    groups = ["bucket_us", *query.group_by]
    ordered = {k.column for k in query.order_by}
    order = [
        f"{'bucket_us' if k.column == 'bucket_start' else k.column} "
        f"{'DESC' if k.descending else 'ASC'} NULLS LAST"
        for k in query.order_by
    ]
    order += [
        c
        for c in groups
        if c not in ordered and not (c == "bucket_us" and "bucket_start" in ordered)
    ]
    params["limit"] = query.limit + 1
    # Two stages: sums per group and run first (cheap), then the run ids per group.
    sql = f"""
        WITH merged AS ({merged}),
        per_run AS (
            SELECT {bucket} AS bucket_us,
                   {", ".join([*query.group_by, ""])}run_id,
                   sum(impressions) AS impressions, sum(clicks) AS clicks,
                   sum(stale_events) AS stale_events
            FROM merged GROUP BY ALL
        )
        SELECT {", ".join(groups)},
               sum(impressions)::BIGINT AS impressions,
               sum(clicks)::BIGINT AS clicks,
               CASE WHEN sum(impressions) > 0
                    THEN sum(clicks)::DOUBLE / sum(impressions) END AS ctr,
               sum(stale_events)::BIGINT AS stale_events,
               list_sort(list(run_id) FILTER (WHERE run_id IS NOT NULL)) AS run_ids
        FROM per_run
        GROUP BY ALL
        ORDER BY {", ".join(order)}
        LIMIT $limit
    """
    return sql, params


def merged_sql(
    *,
    batch: str,
    speed: str,
    covered: str,
    stale: str | None = None,
    dimensions: Sequence[str] = DIMENSIONS,
) -> str:
    """The merge rule at minute grain, as one SELECT (also the sandbox's ``ctr`` view).

    Per minute bucket: covered by a batch run → the batch rows plus the late arrivals no run
    has counted yet (``stale``), else the speed rows. Columns: bucket_start, ``dimensions``,
    impressions, clicks, stale_events, source ('batch' | 'late' | 'speed'), run_id.
    ``covered`` must hold disjoint intervals, so the as-of join finds the one that could hold a
    bucket. ``dimensions`` come from :data:`views.DIMENSIONS`, never from a request.
    """
    unknown = set(dimensions) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"'dimensions' must be among {DIMENSIONS}, got {sorted(unknown)}")
    columns = ", ".join(["t.bucket_start", *(f"t.{d}" for d in dimensions)])
    return _merge_rule(_Sides(batch, speed, covered, stale), columns=columns, source=True)


@dataclass(frozen=True)
class _Sides:
    """The relations the merge rule reads (trusted names)."""

    batch: str
    speed: str
    covered: str
    stale: str | None = None


def _merge_rule(
    sides: _Sides,
    *,
    columns: str,
    where: Sequence[str] = (),
    predicate: str | None = None,
    source: bool = False,
) -> str:
    """The serving rule, written once: per minute bucket, covered by a batch run → the batch
    rows plus the bucket's arrivals no run has counted yet, else the speed rows.

    Of ``sides``, ``covered`` holds the disjoint covered intervals; the as-of join finds the one
    interval that could hold a bucket. ``stale`` holds the uncounted arrivals (only covered
    buckets have any).
    ``predicate``, when given, is the same coverage as a range predicate on ``t.bucket_start``
    (:func:`lake.coverage.in_intervals_sql`), which DuckDB pushes into the Parquet scan instead
    of joining. ``where`` narrows every side; ``source`` adds a column saying which side a row
    came from. Every row says how many of its events are uncounted arrivals (``stale_events``).
    """
    batch, speed, covered, stale = sides.batch, sides.speed, sides.covered, sides.stale
    narrow = "".join(f" AND {condition}" for condition in where)
    from_batch = ", 'batch' AS source" if source else ""
    from_speed = ", 'speed' AS source" if source else ""
    counted = "t.impressions, t.clicks, 0::BIGINT AS stale_events"
    late = ""
    if stale is not None:
        from_late = ", 'late' AS source" if source else ""
        late = f"""
            UNION ALL
            SELECT {columns}, t.impressions, t.clicks, t.stale_events{from_late},
                   NULL::VARCHAR AS run_id
            FROM {stale} t WHERE true{narrow}
        """
    if predicate is not None:
        return f"""
            SELECT {columns}, {counted}{from_batch}, t.run_id
            FROM {batch} t WHERE {predicate}{narrow}
            UNION ALL
            SELECT {columns}, {counted}{from_speed}, NULL::VARCHAR AS run_id
            FROM {speed} t WHERE NOT {predicate}{narrow}{late}
        """
    return f"""
        SELECT {columns}, {counted}{from_batch}, t.run_id
        FROM {batch} t ASOF JOIN {covered} c ON t.bucket_start >= c.interval_start
        WHERE t.bucket_start < c.interval_end{narrow}
        UNION ALL
        SELECT {columns}, {counted}{from_speed}, NULL::VARCHAR AS run_id
        FROM {speed} t ASOF LEFT JOIN {covered} c ON t.bucket_start >= c.interval_start
        WHERE (c.interval_end IS NULL OR t.bucket_start >= c.interval_end){narrow}{late}
    """


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
        if len(unique) > MAX_FILTER_VALUES:
            raise QueryError(name, f"at most {MAX_FILTER_VALUES} values, got {len(unique)}")
        if unique:
            pinned.append((name, unique))
    return tuple(pinned)


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
