"""A CTR query: validated parameters, and the DuckDB SQL that answers it with bound values.

Only identifiers from fixed allow-lists (the dimensions, the measures, the registered table
names) are written into the SQL text; every value a user sent travels as a bound parameter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from access.roles import Scope
from events.countries import ISO_3166_ALPHA2
from lake.coverage.model import in_intervals_sql
from runtime.times import EARLIEST, LATEST
from views.columns import ATTRIBUTION_MEASURES, DIMENSIONS, SKETCHES
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
        group_by: Sequence[str] = (),
        filters: Mapping[str, Sequence[str]] | None = None,
        order_by: Sequence[str] = (),
        limit: int = 10_000,
        scope: Scope | None = None,
        reach: bool = False,
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
    marks: str | None = None,
) -> tuple[str, dict[str, object]]:
    """SQL and bound parameters for ``query`` over registered relations.

    ``batch`` and ``speed`` hold a version's rows with the five counts of
    :data:`views.columns.MEASURES` (:func:`side_rows_sql` makes them of a table's rows),
    ``covered`` the disjoint covered intervals (``interval_start``, ``interval_end``), ``stale``
    the late arrivals no batch run has counted yet (rows of
    :func:`lake.coverage.staleness.stale_sql`, all in covered buckets); each a relation name or
    a parenthesized SELECT. Per minute bucket the rule is: covered → batch rows plus its stale
    arrivals, else speed rows. ``intervals``,
    when given, are the same disjoint intervals as far as they meet the query's range (at most
    :data:`MAX_PREDICATE_INTERVALS`); they turn the rule into a range predicate instead of an
    as-of join. ``marks``, for a version with click attribution, are the covered rows a late
    event in another minute may change (rows of :func:`lake.coverage.staleness.stale_marks_sql`:
    no counts). A row's ``stale_events`` are the late events that may change it, of its own
    buckets and dimensions (its stale arrivals and its marks), each counted once. Columns:
    bucket_us (bucket start, microseconds since the epoch), the group_by dimensions,
    impressions, clicks, raw_clicks, orphan_clicks, repeat_clicks (null for a version without
    attribution), ctr, stale_events, run_ids. One row more than
    ``query.limit``, so the caller can tell a truncated answer.
    """
    params: dict[str, object] = {}
    where = _narrowing(query, params)
    columns = ", ".join(["t.bucket_start", *(f"t.{d}" for d in query.group_by)])
    merged = _merge_rule(
        _Sides(batch, speed, covered, stale),
        columns=columns,
        where=where,
        predicate=_covered_predicate(intervals, params),
    )
    bucket = _bucket(query, params)
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
    stale_events = "0::BIGINT"
    staled = joined = ""
    sources = _late_sources(stale, marks)
    if sources is not None:
        # Each late source once per row, however many of the row's minutes it may change.
        keys = "".join(f"{d}, " for d in query.group_by)
        staled = f""",
        staled AS (
            SELECT bucket_us, {keys}sum(events) AS stale_events
            FROM (
                SELECT DISTINCT {bucket} AS bucket_us, {keys}arrival_key, events
                FROM ({sources}) t WHERE {" AND ".join(where)}
            ) GROUP BY ALL
        )"""
        joined = f" LEFT JOIN staled USING ({', '.join(groups)})"
        stale_events = "coalesce(any_value(staled.stale_events), 0)::BIGINT"
    # Two stages: sums per group and run first (cheap), then the run ids per group.
    sql = f"""
        WITH merged AS ({merged}),
        per_run AS (
            SELECT {bucket} AS bucket_us,
                   {", ".join([*query.group_by, ""])}run_id,
                   {", ".join(f"sum({m}) AS {m}" for m in COUNTS)}
            FROM merged GROUP BY ALL
        ){staled}
        SELECT {", ".join(groups)},
               {", ".join(f"sum({m})::BIGINT AS {m}" for m in COUNTS)},
               CASE WHEN sum(impressions) > 0
                    THEN sum(clicks)::DOUBLE / sum(impressions) END AS ctr,
               {stale_events} AS stale_events,
               list_sort(list(run_id) FILTER (WHERE run_id IS NOT NULL)) AS run_ids
        FROM per_run{joined}
        GROUP BY ALL
        ORDER BY {", ".join(order)}
        LIMIT $limit
    """
    return sql, params


def reach_sql(
    query: CtrQuery,
    *,
    batch: str,
    speed: str,
    covered: str,
    intervals: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
) -> tuple[str, str, dict[str, object]]:
    """Two SELECTs (and their bound parameters) of who ``query``'s rows reached: per bucket and
    group (the rows of :func:`ctr_sql`, keyed the same: ``bucket_us`` and the group_by
    dimensions), by the same merge rule over the same relations, but ``batch`` and ``speed``
    as stored (with the :data:`views.columns.USER_LISTS` and :data:`views.columns.SKETCHES`
    each has; ``speed`` already narrowed to the version's events).

    The first: ``listed`` (every row a batch row with user lists), ``reach_sketches`` and
    ``clicker_sketches`` (every row's sketch, to union), ``unsketched`` (rows with events but
    no sketch: written before reach was measured). The second: ``users`` and ``clickers``, the
    exact distinct counts of the batch rows' lists (the bucket's reach when every row is
    listed); a distinct count over every user id of the range, DuckDB's hash aggregate over
    the lists unnested (measured: 2-4x faster than distinct lists per group).
    """
    params: dict[str, object] = {}
    where = _narrowing(query, params)
    groups = "".join(f", t.{d}" for d in query.group_by)
    merged = _merge_rule(
        _Sides(batch, speed, covered),
        columns=f"t.bucket_start{groups}",
        where=where,
        predicate=_covered_predicate(intervals, params),
        extra=_REACH_COLUMNS,
    )
    bucket = _bucket(query, params)
    keys = "".join(f", {d}" for d in query.group_by)
    grouped = ", ".join(["bucket_us", *query.group_by])
    sketched = f"""
        SELECT {bucket} AS bucket_us{keys},
               bool_and(users IS NOT NULL) AS listed,
               list(reach_sketch) FILTER (WHERE reach_sketch IS NOT NULL) AS reach_sketches,
               list(clicker_sketch) FILTER (WHERE clicker_sketch IS NOT NULL)
                   AS clicker_sketches,
               count(*) FILTER (
                   WHERE reach_sketch IS NULL AND (impressions > 0 OR clicks > 0)
               ) AS unsketched
        FROM ({merged}) GROUP BY {grouped}
    """
    # Two lists unnested side by side: the shorter padded with nulls, which count nothing.
    counted = f"""
        SELECT bucket_us{keys}, count(DISTINCT u) AS users, count(DISTINCT c) AS clickers
        FROM (
            SELECT {bucket} AS bucket_us{keys}, unnest(users) AS u, unnest(clickers) AS c
            FROM ({merged}) WHERE users IS NOT NULL
        ) GROUP BY {grouped}
    """
    return sketched, counted, params


def merged_sql(
    *,
    batch: str,
    speed: str,
    covered: str,
    stale: str | None = None,
    dimensions: Sequence[str] = DIMENSIONS,
    sketched: bool = False,
) -> str:
    """The merge rule at minute grain, as one SELECT (also the sandbox's ``ctr`` view).

    Per minute bucket: covered by a batch run → the batch rows plus the late arrivals no run
    has counted yet (``stale``), else the speed rows. Columns: bucket_start, ``dimensions``,
    impressions, clicks, raw_clicks, orphan_clicks, repeat_clicks, stale_events, source
    ('batch' | 'late' | 'speed'), run_id. The sides are those of :func:`ctr_sql`.
    ``covered`` must hold disjoint intervals, so the as-of join finds the one that could hold a
    bucket. ``dimensions`` come from :data:`views.DIMENSIONS`, never from a request.
    ``sketched``: the rows' :data:`views.columns.SKETCHES` too, after the counts (the sides
    must have them; late arrivals have none: null), to union (``sketch_union``).
    """
    unknown = set(dimensions) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"'dimensions' must be among {DIMENSIONS}, got {sorted(unknown)}")
    columns = ", ".join(["t.bucket_start", *(f"t.{d}" for d in dimensions)])
    extra = None
    if sketched:
        measures = ", ".join(f"t.{m}" for m in COUNTS)
        sketch = ", ".join(f"t.{s}" for s in SKETCHES)
        counted = f"{measures}, 0::BIGINT AS stale_events, {sketch}"
        unsketched = ", ".join(f"NULL::BLOB AS {s}" for s in SKETCHES)
        extra = {
            "batch": counted,
            "speed": counted,
            "late": f"{measures}, t.stale_events, {unsketched}",
        }
    return _merge_rule(
        _Sides(batch, speed, covered, stale), columns=columns, source=True, extra=extra
    )


def side_rows_sql(
    relation: str,
    *,
    columns: Collection[str],
    attribution: bool,
    speed: bool,
    where: str | None = None,
    keep: Sequence[str] = (),
) -> str:
    """SELECT of a batch or speed table's rows as the merge rule reads them: bucket_start, the
    dimensions, the five counts of :data:`views.columns.MEASURES` (and run_id for batch rows),
    one projection of the rows as stored.

    ``relation`` is a trusted relation name, ``columns`` the columns it has (a table written
    before the attribution counts has none of them), ``attribution`` whether the version
    attributes clicks (:attr:`views.definitions.Definition.attribution`), ``speed`` whether the
    rows are ``speed/ctr``'s, ``where`` the version's trusted predicate on the dimensions,
    ``keep`` more columns to select as they are (trusted names).
    Without attribution ``raw_clicks`` are the clicks and the other two are null. With it, a
    batch table has every count; ``speed/ctr``'s ``clicks`` are the click events, so its
    ``attributed_clicks`` are the clicks and its ``clicks`` the raw clicks (rows written before
    the speed job counted attribution count 0 of each).
    """

    def count(name: str, missing: str) -> str:
        return name if name in columns else missing

    if not attribution:
        counts = "clicks, clicks AS raw_clicks, NULL::BIGINT AS orphan_clicks, "
        counts += "NULL::BIGINT AS repeat_clicks"
    elif speed:

        def attributed(stored: str) -> str:
            return f"coalesce({count(stored, 'NULL')}, 0)::BIGINT"

        counts = (
            f"{attributed('attributed_clicks')} AS clicks, clicks AS raw_clicks, "
            f"{attributed('orphan_clicks')} AS orphan_clicks, "
            f"{attributed('repeat_clicks')} AS repeat_clicks"
        )
    else:
        counts = ", ".join(
            ["clicks", *(f"{count(m, 'NULL::BIGINT')} AS {m}" for m in ATTRIBUTION_MEASURES)]
        )
    run_id = "".join(f", {c}" for c in ([] if speed else ["run_id"]) + list(keep))
    narrow = f" WHERE {where}" if where else ""
    return (
        f"SELECT bucket_start, {', '.join(DIMENSIONS)}, impressions, {counts}{run_id} "
        f"FROM {relation}{narrow}"
    )


def _late_sources(stale: str | None, marks: str | None) -> str | None:
    """One SELECT of the late sources that may change a row: bucket_start, the dimensions,
    arrival_key (one per arrival row and kind of event) and events. A stale arrival changes its own
    row (its impressions and its clicks, two sources); a mark of
    :func:`lake.coverage.staleness.stale_marks_sql` a row of another bucket."""
    dims = ", ".join(DIMENSIONS)
    parts = []
    if stale is not None:
        # An arrival key's rows summed (a bucket and dimensions can have a row per archiver
        # task), as the marks sum them: one source, one count, whichever way it is reached.
        for kind, column in (("i", "impressions"), ("c", "raw_clicks")):
            parts.append(
                f"SELECT bucket_start, {dims}, hash(arrival_key, '{kind}') AS arrival_key, "
                f"sum({column}) AS events FROM {stale} WHERE {column} > 0 GROUP BY ALL"
            )
    if marks is not None:
        parts.append(
            f"SELECT bucket_start, {dims}, arrival_key, stale_events AS events FROM {marks}"
        )
    return " UNION ALL ".join(parts) if parts else None


def _narrowing(query: CtrQuery, params: dict[str, object]) -> list[str]:
    """The conditions on a side's rows (alias ``t``) that select ``query``'s range, filters
    and scope, their values added to ``params``."""
    params.update(start=query.start, end=query.end)
    where = ["t.bucket_start >= $start", "t.bucket_start < $end"]
    for name, values in query.filters:
        placeholders = []
        for i, value in enumerate(values):
            params[f"{name}_{i}"] = value
            placeholders.append(f"${name}_{i}")
        where.append(f"t.{name} IN ({', '.join(placeholders)})")
    if query.scope is not None:
        condition, bound = query.scope.sql("t")
        where.append(condition)
        params.update(bound)
    return where


def _covered_predicate(
    intervals: Sequence[tuple[dt.datetime, dt.datetime]] | None, params: dict[str, object]
) -> str | None:
    """The covered ``intervals`` as a range predicate on ``t.bucket_start`` (their bounds
    added to ``params``); None without them (the merge rule then joins the covered table)."""
    if intervals is None:
        return None
    if len(intervals) > MAX_PREDICATE_INTERVALS:
        raise ValueError(f"at most {MAX_PREDICATE_INTERVALS} 'intervals', got {len(intervals)}")
    bounds = []
    for i, (start, end) in enumerate(intervals):
        params[f"cov_start_{i}"], params[f"cov_end_{i}"] = start, end
        bounds.append((f"$cov_start_{i}", f"$cov_end_{i}"))
    return in_intervals_sql("t.bucket_start", bounds)


def _bucket(query: CtrQuery, params: dict[str, object]) -> str:
    """The SQL of a row's bucket start (``bucket_start``) in ``query``'s granularity.

    Buckets as integer microseconds since the epoch: UTC minutes, hours and days are whole
    multiples of their length, and integer division is far cheaper than date_trunc on a
    TIMESTAMPTZ (which goes through the ICU calendar for every row). ``all`` is one bucket
    starting at the range's start."""
    if query.granularity == "all":
        params["start_us"] = int(query.start.timestamp()) * 1_000_000  # whole minutes
        return "$start_us::BIGINT"
    params["step_us"] = query.step // dt.timedelta(microseconds=1)
    return "(epoch_us(bucket_start) // $step_us) * $step_us"


# What reach_sql reads of each side's rows besides the key: a speed row has no user lists.
_REACH_COLUMNS: Final = {
    "batch": "t.impressions, t.clicks, t.users, t.clickers, t.reach_sketch, t.clicker_sketch",
    "speed": "t.impressions, t.clicks, NULL::VARCHAR[] AS users, NULL::VARCHAR[] AS clickers, "
    "t.reach_sketch, t.clicker_sketch",
}


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
    extra: Mapping[str, str] | None = None,
) -> str:
    """The serving rule, written once: per minute bucket, covered by a batch run → the batch
    rows plus the bucket's arrivals no run has counted yet, else the speed rows.

    Of ``sides``, ``covered`` holds the disjoint covered intervals; the as-of join finds the one
    interval that could hold a bucket. ``stale`` holds the uncounted arrivals (only covered
    buckets have any).
    ``predicate``, when given, is the same coverage as a range predicate on ``t.bucket_start``
    (:func:`lake.coverage.in_intervals_sql`), which DuckDB pushes into the Parquet scan instead
    of joining. ``where`` narrows every side; ``source`` adds a column saying which side a row
    came from. Every row has the five counts of :data:`views.columns.MEASURES` and says how
    many of its events are uncounted arrivals (``stale_events``). ``extra`` replaces those
    columns by others, per side (``batch``, ``speed``, ``late``: select lists over ``t``; a side
    not named keeps them).
    """
    batch, speed, covered, stale = sides.batch, sides.speed, sides.covered, sides.stale
    narrow = "".join(f" AND {condition}" for condition in where)
    from_batch = ", 'batch' AS source" if source else ""
    from_speed = ", 'speed' AS source" if source else ""
    measures = ", ".join(f"t.{m}" for m in COUNTS)
    counted = f"{measures}, 0::BIGINT AS stale_events"
    counted_late = f"{measures}, t.stale_events"
    extra = extra or {}
    counted_batch = extra.get("batch", counted)
    counted_speed = extra.get("speed", counted)
    counted_late = extra.get("late", counted_late)
    late = ""
    if stale is not None:
        from_late = ", 'late' AS source" if source else ""
        late = f"""
            UNION ALL
            SELECT {columns}, {counted_late}{from_late},
                   NULL::VARCHAR AS run_id
            FROM {stale} t WHERE true{narrow}
        """
    if predicate is not None:
        return f"""
            SELECT {columns}, {counted_batch}{from_batch}, t.run_id
            FROM {batch} t WHERE {predicate}{narrow}
            UNION ALL
            SELECT {columns}, {counted_speed}{from_speed}, NULL::VARCHAR AS run_id
            FROM {speed} t WHERE NOT {predicate}{narrow}{late}
        """
    return f"""
        SELECT {columns}, {counted_batch}{from_batch}, t.run_id
        FROM {batch} t ASOF JOIN {covered} c ON t.bucket_start >= c.interval_start
        WHERE t.bucket_start < c.interval_end{narrow}
        UNION ALL
        SELECT {columns}, {counted_speed}{from_speed}, NULL::VARCHAR AS run_id
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
