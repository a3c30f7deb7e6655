"""The DuckDB SQL that answers a :class:`~serving_layer.query.CtrQuery`, with bound values: its
rows by the merge rule (:mod:`serving_layer.merge_rule`) rolled up to its buckets and groups,
and who they reached.

Only identifiers from fixed allow-lists (the dimensions, the measures, the registered table
names) are written into the SQL text; every value a user sent travels as a bound parameter.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Final, NamedTuple

from lake.coverage.model import in_intervals_sql
from serving_layer.merge_rule import Sides, merge_rule
from serving_layer.query import CtrQuery
from views.columns import DIMENSIONS, SKETCHES
from views.columns import MEASURES as COUNTS

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
    :data:`views.columns.MEASURES` (:func:`serving_layer.sides.side_rows_sql` makes them
    of a table's rows),
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
    merged = merge_rule(
        Sides(batch, speed, covered, stale),
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


def reach_sql(  # noqa: PLR0913 - keyword-only relations and parts of one query
    query: CtrQuery,
    *,
    batch: str,
    speed: str,
    covered: str,
    intervals: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
    exact: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
    counted: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
    hours: tuple[str, Sequence[tuple[dt.datetime, dt.datetime]]] | None = None,
) -> ReachStatements:
    """Two SELECTs (each with its bound parameters) of who ``query``'s rows reached: per bucket and
    group (the rows of :func:`ctr_sql`, keyed the same: ``bucket_us`` and the group_by
    dimensions), by the same merge rule over the same relations, but ``batch`` and ``speed``
    as stored (with the :data:`views.columns.USER_NUMBERS`, :data:`views.columns.USER_LISTS`
    and :data:`views.columns.SKETCHES` each has; ``speed`` already narrowed to the version's
    events).

    The first, ``sketched``: ``listed`` (every row a batch row with user lists),
    ``reach_sketches`` and ``clicker_sketches`` (every row's sketch, to union), ``unsketched``
    (rows with events but no sketch: written before reach was measured). The second,
    ``counted``: ``users`` and ``clickers``, the exact distinct counts of the batch rows'
    lists (the bucket's reach when every row is listed), and ``listed`` again.

    ``exact``, when given, are the parts of the range whose buckets lie wholly in covered
    minutes (at most :data:`MAX_PREDICATE_INTERVALS`), the buckets whose reach is the exact
    count: ``counted`` then reads only those and ``sketched`` only the rest (``bench reach``:
    otherwise a day's exact count read every sketch of the day, and a mixed bucket's estimate
    counted every user id exactly for nothing). Without it, both read the whole range.
    ``counted``, when given, narrows the exact count further (the rest of ``exact`` is counted
    from hour rows' bitmaps: :func:`bitmap_sql`); empty, there is no ``counted`` SELECT (None).

    ``hours``: the relation of the view's hour rows and the whole hours where they
    stand in for the batch minute rows (:mod:`serving_layer.hour_rows`): ``sketched`` then
    unions an hour's sketch instead of its 60 minutes' (the same estimate: the registers are
    the same, :func:`views.sketches.estimate`).
    """
    params: dict[str, object] = {}
    where = _narrowing(query, params)
    groups = "".join(f", t.{d}" for d in query.group_by)
    predicate = _covered_predicate(intervals, params)
    counted_where, sketched_where = where, where
    if exact is not None:
        inside = _bounded("t.bucket_start", "exact", exact, params)
        counted_where, sketched_where = [*where, inside], [*where, f"NOT {inside}"]

    sketch_batch = batch
    if hours is not None:
        relation, used = hours
        in_hours = _bounded("bucket_start", "hours", used, params)
        # An hour row as the sketch union reads a batch row: its key, counts and sketches.
        hour_rows = ", ".join(["bucket_start", *DIMENSIONS, "impressions", "clicks", *SKETCHES])
        sketch_batch = (
            f"(SELECT * FROM {batch} WHERE NOT {in_hours} "
            f"UNION ALL BY NAME SELECT {hour_rows} FROM {relation} WHERE {in_hours})"
        )
    if counted is not None:
        counted_where = [*where, _bounded("t.bucket_start", "counted", counted, params)]

    def merged(narrowing: list[str], batch: str = batch) -> str:
        return merge_rule(
            Sides(batch, speed, covered),
            columns=f"t.bucket_start{groups}",
            where=narrowing,
            predicate=predicate,
            extra=_REACH_COLUMNS,
        )

    bucket = _bucket(query, params)
    keys = "".join(f", {d}" for d in query.group_by)
    grouped = ", ".join(["bucket_us", *query.group_by])
    sketched = f"""
        SELECT {bucket} AS bucket_us{keys},
               {_LISTED} AS listed,
               list(reach_sketch) FILTER (WHERE reach_sketch IS NOT NULL) AS reach_sketches,
               list(clicker_sketch) FILTER (WHERE clicker_sketch IS NOT NULL)
                   AS clicker_sketches,
               count(*) FILTER (
                   WHERE reach_sketch IS NULL AND (impressions > 0 OR clicks > 0)
               ) AS unsketched
        FROM ({merged(sketched_where, sketch_batch)}) GROUP BY {grouped}
    """
    # How many sketches ``sketched`` would bring into the process, counted where they lie.
    sketch_count = f"""
        SELECT count(reach_sketch) + count(clicker_sketch)
        FROM ({merged(sketched_where, sketch_batch)})
    """
    counting = _with_params(sketch_count, params)
    if counted is not None and not counted:
        return ReachStatements(_with_params(sketched, params), None, counting)
    # The distinct values of each group's lists gathered into one (measured on the reach
    # benchmark's lake, 6 hours per minute and country: 2.9x faster than DuckDB's hash aggregate
    # over the lists unnested for numbers, 1.8x for ids; per hour, 1.3x for numbers, 0.8x for
    # ids). A bucket is counted from its numbers when every row has them, from its ids when
    # every row has those (rows written before the dictionary); one mixing both, or with a
    # row without either (written before reach was measured), is not listed.
    counted_sql = f"""
        SELECT {bucket} AS bucket_us{keys},
               CASE WHEN bool_and(user_nos IS NOT NULL)
                    THEN list_unique(flatten(list(user_nos)))
                    ELSE list_unique(flatten(list(users))) END AS users,
               CASE WHEN bool_and(user_nos IS NOT NULL)
                    THEN list_unique(flatten(list(clicker_nos)))
                    ELSE list_unique(flatten(list(clickers))) END AS clickers,
               {_LISTED} AS listed
        FROM ({merged(counted_where)}) GROUP BY {grouped}
    """
    return ReachStatements(
        _with_params(sketched, params), _with_params(counted_sql, params), counting
    )


class ReachStatements(NamedTuple):
    """:func:`reach_sql`'s SELECTs, each with the parameters it binds."""

    sketched: tuple[str, dict[str, object]]
    counted: tuple[str, dict[str, object]] | None
    # How many sketches ``sketched`` reads (a bound is checked before they are fetched).
    sketch_count: tuple[str, dict[str, object]] | None = None


def _with_params(sql: str, params: dict[str, object]) -> tuple[str, dict[str, object]]:
    """``sql`` with the ``params`` it names (DuckDB refuses a parameter a statement lacks)."""
    return sql, {k: v for k, v in params.items() if re.search(rf"\${re.escape(k)}\b", sql)}


def bitmap_sql(
    query: CtrQuery, *, hours: str, parts: Sequence[tuple[dt.datetime, dt.datetime]]
) -> tuple[str, dict[str, object]]:
    """SELECT (and its bound parameters) of the hour rows in ``parts`` (whole hours, whole
    buckets: :mod:`serving_layer.hour_rows`) of the relation ``hours``, within ``query``'s
    filters and scope: per row its ``bucket_us`` and group values (keyed as :func:`reach_sql`
    keys them) and its bitmaps of user numbers, whose unions per key are the exact reach."""
    params: dict[str, object] = {}
    where = [*_narrowing(query, params), _bounded("t.bucket_start", "bitmaps", parts, params)]
    keys = "".join(f", t.{d}" for d in query.group_by)
    sql = f"""
        SELECT {_bucket(query, params)} AS bucket_us{keys}, t.user_bitmap, t.clicker_bitmap
        FROM {hours} t WHERE {" AND ".join(where)}
    """
    return sql, params


def cube_dimension(query: CtrQuery) -> str | None:
    """The reach cube's dimension (:mod:`batch_layer.reach_cube`) whose rows answer
    ``query``'s reach, or None: buckets of an hour or more, grouped by at most one dimension,
    filtered (and scoped) on that one only. ``*``: no group and no filter (the whole)."""
    if query.granularity == "minute" or len(query.group_by) > 1:
        return None
    named = {*query.group_by, *(name for name, _ in query.filters)}
    if query.scope is not None:
        if query.scope.ads:
            return None
        named.add("campaign_id")
    if len(named) > 1:
        return None
    return next(iter(named)) if named else "*"


def cube_sql(
    query: CtrQuery, *, cube: str, dimension: str, parts: Sequence[tuple[dt.datetime, dt.datetime]]
) -> tuple[str, dict[str, object]]:
    """SELECT (and parameters) of the reach cube's rows of ``dimension`` (:func:`cube_dimension`)
    in ``parts`` (whole hours, whole buckets) of the relation ``cube``, within ``query``'s
    filters and scope: per row its ``bucket_us`` and group value (keyed as :func:`reach_sql`
    keys them) and its bitmaps, whose unions per key are the exact reach."""
    params: dict[str, object] = {"dimension": dimension}
    where = ["t.dimension = $dimension", _bounded("t.bucket_start", "cube", parts, params)]
    values: set[str] | None = None
    for name, chosen in query.filters:
        if name == dimension:
            values = set(chosen) if values is None else values & set(chosen)
    if query.scope is not None and dimension == "campaign_id":
        scoped = set(query.scope.campaigns)
        values = scoped if values is None else values & scoped
    if values is not None:
        placeholders = []
        for i, value in enumerate(sorted(values)):
            params[f"value_{i}"] = value
            placeholders.append(f"$value_{i}")
        where.append(f"t.value IN ({', '.join(placeholders)})" if placeholders else "FALSE")
    key = f", t.value AS {dimension}" if query.group_by else ""
    sql = f"""
        SELECT {_bucket(query, params)} AS bucket_us{key}, t.user_bitmap, t.clicker_bitmap
        FROM {cube} t WHERE {" AND ".join(where)}
    """
    return sql, params


def bitmap_rows_sql(
    query: CtrQuery, *, hours: str, parts: Sequence[tuple[dt.datetime, dt.datetime]]
) -> tuple[str, dict[str, object]]:
    """SELECT (and parameters) of how many hour rows :func:`bitmap_sql` would read."""
    params: dict[str, object] = {}
    where = [*_narrowing(query, params), _bounded("t.bucket_start", "bitmaps", parts, params)]
    return f"SELECT count(*) FROM {hours} t WHERE {' AND '.join(where)}", params


def hour_check_sql(
    *, batch: str, hours: str, start: dt.datetime, end: dt.datetime
) -> tuple[str, dict[str, object]]:
    """SELECT (and parameters) of the hours in [``start``, ``end``) (whole hours) whose hour
    rows may not stand in for their minute rows, as ``hour_us`` (the hour's start in
    microseconds since the epoch): the minute rows of ``batch`` and the hour rows of ``hours``
    are not all one run's, the same run (an hour with neither is not one of them: it holds
    nothing either way)."""
    params: dict[str, object] = {"check_start": start, "check_end": end}
    runs = """
        SELECT epoch_us(bucket_start) // 3600000000 * 3600000000 AS hour_us,
               min(run_id) AS first, max(run_id) AS last
        FROM {} WHERE bucket_start >= $check_start AND bucket_start < $check_end GROUP BY 1
    """
    sql = f"""
        SELECT hour_us
        FROM ({runs.format(batch)}) m FULL JOIN ({runs.format(hours)}) h USING (hour_us)
        WHERE (m.first = m.last AND h.first = h.last AND m.first = h.first) IS NOT TRUE
    """
    return sql, params


def _bounded(
    column: str,
    name: str,
    intervals: Sequence[tuple[dt.datetime, dt.datetime]],
    params: dict[str, object],
) -> str:
    """``column`` in one of ``intervals`` as SQL, their bounds added to ``params`` as
    ``{name}_start_i`` and ``{name}_end_i``."""
    if len(intervals) > MAX_PREDICATE_INTERVALS:
        raise ValueError(f"at most {MAX_PREDICATE_INTERVALS} {name!r}, got {len(intervals)}")
    bounds = []
    for i, (start, end) in enumerate(intervals):
        params[f"{name}_start_{i}"], params[f"{name}_end_{i}"] = start, end
        bounds.append((f"${name}_start_{i}", f"${name}_end_{i}"))
    return in_intervals_sql(column, bounds)


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
    return _bounded("t.bucket_start", "cov", intervals, params)


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
    "batch": "t.impressions, t.clicks, t.users, t.clickers, t.user_nos, t.clicker_nos, "
    "t.reach_sketch, t.clicker_sketch",
    "speed": "t.impressions, t.clicks, NULL::VARCHAR[] AS users, NULL::VARCHAR[] AS clickers, "
    "NULL::INTEGER[] AS user_nos, NULL::INTEGER[] AS clicker_nos, "
    "t.reach_sketch, t.clicker_sketch",
}
# Whether a group's rows all have exact lists of one kind (views.columns.USER_NUMBERS, or
# USER_LISTS in rows written before the dictionary).
_LISTED: Final = "(bool_and(user_nos IS NOT NULL) OR bool_and(users IS NOT NULL))"
