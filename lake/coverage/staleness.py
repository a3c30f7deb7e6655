"""Which covered minute buckets received events after the batch run that made them exact.

A bucket is exact as of the master/events version the latest run covering it read (the largest
``input_version`` among the ``batch/coverage`` rows whose interval holds it). Arrivals
(:mod:`lake.arrivals`) of that bucket with a later ``events_version`` are events that run did
not count: the bucket is *stale* until a run recomputes it. :func:`stale_sql` is that rule,
written once, as DuckDB SQL over three relations; the serving layer runs it once per version of
``master/arrivals`` and ``batch/coverage`` (never per request), `ctr batch --stale` and the
``ctr_recompute_stale`` DAG run it over the tables read with delta-rs (:func:`read_stale`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lake import view_files
from lake.catalog import BATCH_COVERAGE, MASTER_ARRIVALS, batch_table
from lake.coverage.log import read_runs
from lake.coverage.model import Coverage, CoverageRuns
from lake.registry import read_registry
from lake.settings import LakeSettings
from lake.storage import arrow_filesystem, is_delta, open_delta
from runtime.object_store import ObjectStoreSettings
from runtime.times import utc
from views.columns import DIMENSIONS
from views.definitions import Definition

HOUR: Final = dt.timedelta(hours=1)
MINUTE: Final = dt.timedelta(minutes=1)


def arrival_key_sql(alias: str) -> str:
    """SQL of the key of an arrivals row's events (alias ``alias``): its bucket, dimensions,
    master/events version and archiver batch. One late source counts once in a row however many
    of the row's minutes it may change (:func:`serving_layer.ctr_sql.ctr_sql`)."""
    dims = ", ".join(f"{alias}.{d}" for d in DIMENSIONS)
    return f"hash({alias}.bucket_start, {dims}, {alias}.events_version, {alias}.batch_id)"


def stale_sql(
    *,
    arrivals: str,
    coverage: str,
    batch: str,
    view: str = "ctr",
    attribution: dt.timedelta | None = None,
) -> str:
    """SELECT of the arrivals rows no covering batch run of ``view`` (a view version's key,
    ``ctr`` or ``ctr@v2``) has counted: bucket_start, the dimensions, impressions, clicks,
    raw_clicks, orphan_clicks, repeat_clicks, stale_events (impressions + click events),
    archived_at, arrival_key (:func:`arrival_key_sql`).

    ``arrivals``, ``coverage`` and ``batch`` are trusted relation names (``master/arrivals``,
    ``batch/coverage`` and the version's batch rows); only covered buckets can be stale. A
    bucket whose batch rows come from a run not recorded in ``coverage`` yet (a recompute
    between its two commits) has none: those rows are newer than every recorded run, and
    adding the arrivals again would count them twice.

    The arrivals count click events in their own bucket. Without ``attribution`` those are the
    version's clicks (and raw_clicks; no orphan or repeat counts: NULL). With it (version 3),
    a late click's impression is unknown until the recompute: it adds to raw_clicks only
    (clicks, orphan and repeat clicks 0), so clicks never pass impressions. The rows a late
    click or impression changes besides its own are :func:`stale_marks_sql`'s.
    """
    _check_view(view)
    dims = ", ".join(f"a.{d}" for d in DIMENSIONS)
    if attribution is None:
        measures = "a.clicks, a.clicks AS raw_clicks, NULL::BIGINT AS orphan_clicks, "
        measures += "NULL::BIGINT AS repeat_clicks"
    else:
        measures = "0::BIGINT AS clicks, a.clicks AS raw_clicks, 0::BIGINT AS orphan_clicks, "
        measures += "0::BIGINT AS repeat_clicks"
    return f"""
        WITH buckets AS (SELECT DISTINCT bucket_start FROM {arrivals}),
        {_exact_sql(coverage, batch, view)}
        SELECT a.bucket_start, {dims}, a.impressions, {measures},
               a.impressions + a.clicks AS stale_events, a.archived_at,
               {arrival_key_sql("a")} AS arrival_key
        FROM {arrivals} a JOIN exact e ON a.bucket_start = e.bucket_start
        WHERE a.events_version > e.input_version
          AND a.bucket_start NOT IN (SELECT bucket_start FROM pending)
    """


def stale_marks_sql(
    *, arrivals: str, coverage: str, batch: str, view: str, attribution: dt.timedelta
) -> str:
    """SELECT of the covered rows a version with click ``attribution`` must recompute because
    of arrivals in *other* buckets: bucket_start, the dimensions, stale_events, archived_at,
    arrival_key (:func:`arrival_key_sql` with the kind of event: ``hash(key, 'c')`` for clicks,
    ``hash(key, 'i')`` for impressions).

    A click is credited to its impression, up to ``attribution`` before it, with the same
    dimensions (an event's dimensions are its ad's: a click carries its impression's), and a
    click with no impression in that window is an orphan: so a late click may change the rows
    of its dimensions in the buckets [its bucket - window, its bucket), and a late impression
    those in (its bucket, its bucket + window] (its clicks stop being orphans). Such a row is
    stale when the run covering its bucket read an older master/events version than the
    arrival's, and ``stale_events`` are the events of the arrival that may change it (its clicks
    before its bucket, its impressions after). Only rows the batch layer has are marked: where
    it counted no event of those dimensions in a minute, no impression there can take a late
    click, and no click there was waiting for a late impression. Found in two steps: the
    (bucket, version) pairs of arrivals that change a covered bucket at all (small: one row per
    bucket and archiver commit), then those arrivals' rows with their dimensions.
    """
    _check_view(view)
    window = int(attribution.total_seconds() // 60)
    dims = ", ".join(f"x.{d}" for d in DIMENSIONS)
    plain = ", ".join(DIMENSIONS)
    same = " AND ".join(f"b.{d} = x.{d}" for d in DIMENSIONS)
    return f"""
        WITH arrived AS (
            SELECT bucket_start, events_version, bool_or(impressions > 0) AS impressions,
                   bool_or(clicks > 0) AS clicks
            FROM {arrivals} GROUP BY bucket_start, events_version
        ),
        buckets AS (
            SELECT DISTINCT unnest(generate_series(
                       bucket_start - INTERVAL {window} MINUTE,
                       bucket_start + INTERVAL {window} MINUTE,
                       INTERVAL 1 MINUTE)) AS bucket_start
            FROM (SELECT DISTINCT bucket_start FROM arrived)
        ),
        {_exact_sql(coverage, batch, view)},
        changed AS (
            SELECT a.bucket_start AS arrived_in, a.events_version, e.bucket_start
            FROM arrived a JOIN exact e
              ON (a.clicks AND e.bucket_start >= a.bucket_start - INTERVAL {window} MINUTE
                  AND e.bucket_start < a.bucket_start)
              OR (a.impressions AND e.bucket_start > a.bucket_start
                  AND e.bucket_start <= a.bucket_start + INTERVAL {window} MINUTE)
            WHERE a.events_version > e.input_version
              AND e.bucket_start NOT IN (SELECT bucket_start FROM pending)
        )
        SELECT c.bucket_start, {dims},
               sum(CASE WHEN c.bucket_start < x.bucket_start THEN x.clicks
                        ELSE x.impressions END)::BIGINT AS stale_events,
               min(x.archived_at) AS archived_at,
               hash({arrival_key_sql("x")},
                    CASE WHEN c.bucket_start < x.bucket_start THEN 'c' ELSE 'i' END) AS arrival_key
        FROM changed c JOIN {arrivals} x
          ON x.bucket_start = c.arrived_in AND x.events_version = c.events_version
        SEMI JOIN (
            SELECT DISTINCT bucket_start, {plain} FROM {batch}
            WHERE bucket_start IN (SELECT bucket_start FROM changed)
        ) b ON b.bucket_start = c.bucket_start AND {same}
        WHERE CASE WHEN c.bucket_start < x.bucket_start THEN x.clicks ELSE x.impressions END > 0
        GROUP BY ALL
    """


def _exact_sql(coverage: str, batch: str, view: str) -> str:
    """CTEs ``exact`` (per bucket of a ``buckets`` CTE that a run of ``view`` covers: the
    newest input version of those runs) and ``pending`` (buckets whose batch rows come from a
    run not recorded yet)."""
    return f"""
        exact AS (
            SELECT b.bucket_start, max(c.input_version) AS input_version
            FROM buckets b JOIN {coverage} c
              ON b.bucket_start >= c.interval_start AND b.bucket_start < c.interval_end
            WHERE c.view = '{view}'
            GROUP BY b.bucket_start
        ),
        pending AS (
            SELECT DISTINCT t.bucket_start FROM {batch} t
            WHERE t.bucket_start IN (SELECT bucket_start FROM exact)
              AND t.run_id NOT IN (SELECT run_id FROM {coverage} WHERE view = '{view}')
        )"""


def _check_view(view: str) -> None:
    if not view.replace("@", "").replace("_", "").isalnum():
        raise ValueError(f"'view' must be a view key like ctr or ctr@v2, got {view!r}")


def stale_buckets_sql(stale: str, *, marks: str | None = None) -> str:
    """Per stale bucket of the relation ``stale`` (rows of :func:`stale_sql`) and, for a
    version with attribution, of ``marks`` (rows of :func:`stale_marks_sql`): its stale events
    and when the oldest of them was archived, in bucket order."""
    rows = f"SELECT bucket_start, stale_events, archived_at FROM {stale}"
    if marks is not None:
        rows += f" UNION ALL SELECT bucket_start, stale_events, archived_at FROM {marks}"
    return f"""
        SELECT bucket_start, sum(stale_events)::BIGINT, min(archived_at)
        FROM ({rows}) GROUP BY bucket_start ORDER BY bucket_start
    """


@dataclass(frozen=True)
class StaleBucket:
    bucket_start: dt.datetime
    events: int
    first_archived_at: dt.datetime


@dataclass(frozen=True)
class StaleInterval:
    """Consecutive stale minutes [start, end): their late events, and when the oldest of them
    was archived (how long the interval has been stale)."""

    start: dt.datetime
    end: dt.datetime
    events: int
    first_archived_at: dt.datetime


def stale_buckets(rows: Iterable[tuple[dt.datetime, int, dt.datetime]]) -> list[StaleBucket]:
    """Rows of :func:`stale_buckets_sql` as values (times in UTC)."""
    return [StaleBucket(utc(bucket), int(events), utc(first)) for bucket, events, first in rows]


def stale_intervals(buckets: Sequence[StaleBucket]) -> list[StaleInterval]:
    """Consecutive stale minutes merged into intervals."""
    merged: list[StaleInterval] = []
    for b in sorted(buckets, key=lambda b: b.bucket_start):
        last = merged[-1] if merged else None
        if last is not None and last.end == b.bucket_start:
            merged[-1] = StaleInterval(
                last.start,
                b.bucket_start + MINUTE,
                last.events + b.events,
                min(last.first_archived_at, b.first_archived_at),
            )
        else:
            merged.append(
                StaleInterval(
                    b.bucket_start, b.bucket_start + MINUTE, b.events, b.first_archived_at
                )
            )
    return merged


def recompute_intervals(
    buckets: Sequence[StaleBucket], coverage: Coverage
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The intervals a recompute runs over: every hour holding a stale bucket, as far as the
    batch layer covers it (recomputing a whole covered hour costs about what one minute does,
    and never covers a minute no run covered before), adjacent hours merged."""
    hours = Coverage(
        (start, start + HOUR)
        for start in {b.bucket_start.replace(minute=0, second=0, microsecond=0) for b in buckets}
    )
    parts = [part for hour in hours.intervals for part in coverage.within(hour.start, hour.end)]
    return [(i.start, i.end) for i in Coverage(parts).intervals]


def read_stale(
    lake: LakeSettings, view: Definition | None = None, runs: CoverageRuns | None = None
) -> list[StaleBucket]:
    """The stale buckets of ``view`` (default: the published version of ``ctr``) now:
    master/arrivals and the version's batch rows read with delta-rs (no Spark), ``runs``
    (default: read now) the coverage, the rule run in DuckDB."""
    view = view or read_registry(lake).published("ctr")
    runs = runs if runs is not None else read_runs(lake)
    arrivals = _read(MASTER_ARRIVALS.path(lake), lake.object_store, MASTER_ARRIVALS.schema)
    if arrivals.num_rows == 0:
        return []  # staleness is arrivals no run counted: none, nothing stale
    # The batch rows the rule can reach: the hours of the arrivals' buckets, and the window
    # either side of them for a version with attribution; not the whole table (which grows
    # with history), nor the span between an old late bucket and today's.
    reach = view.attribution or dt.timedelta(0)
    batch = batch_table(view)
    batch_rows = _read(
        batch.path(lake),
        lake.object_store,
        batch.schema,
        ["bucket_start", "run_id", *DIMENSIONS],
        between=arrival_spans(arrivals["bucket_start"], reach),
    )
    coverage_rows = pa.Table.from_pylist(
        [{name: getattr(run, name) for name in BATCH_COVERAGE.schema.names} for run in runs.runs],
        schema=BATCH_COVERAGE.schema,
    )
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("all_arrivals", arrivals)
        con.execute(
            "CREATE VIEW arrivals AS SELECT * FROM all_arrivals"
            + (f" WHERE {view.where}" if view.where else "")
        )
        con.register("coverage", coverage_rows)
        con.register("batch", batch_rows)
        sides = {"arrivals": "arrivals", "coverage": "coverage", "batch": "batch", "view": view.key}
        stale = stale_sql(**sides, attribution=view.attribution)
        marks = None
        if view.attribution is not None:
            marks = f"({stale_marks_sql(**sides, attribution=view.attribution)})"
        rows = con.execute(stale_buckets_sql(f"({stale})", marks=marks)).fetchall()
    return stale_buckets(rows)


# Spans a read of the batch rows is cut into at most (the closest ones merged beyond).
MAX_SPANS: Final = 64


def arrival_spans(
    buckets: pa.ChunkedArray | pa.Array, reach: dt.timedelta = dt.timedelta(0)
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The [first, last] spans of bucket_start holding ``buckets``' hours, widened by
    ``reach`` either side, overlapping ones merged, at most :data:`MAX_SPANS` (the closest
    merged): what a read of the batch rows for those buckets must cover."""
    if len(buckets) == 0:
        return []
    hours = pc.unique(pc.floor_temporal(buckets, unit="hour")).drop_null().to_pylist()
    spans: list[list[dt.datetime]] = []
    for hour in sorted(utc(h) for h in hours):
        first, last = hour - reach, hour + HOUR - MINUTE + reach
        if spans and first <= spans[-1][1] + MINUTE:
            spans[-1][1] = max(spans[-1][1], last)
        else:
            spans.append([first, last])
    while len(spans) > MAX_SPANS:
        gaps = [spans[n + 1][0] - spans[n][1] for n in range(len(spans) - 1)]
        n = gaps.index(min(gaps))
        spans[n : n + 2] = [[spans[n][0], max(spans[n][1], spans[n + 1][1])]]
    return [(first, last) for first, last in spans]


def _read(
    path: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
    columns: list[str] | None = None,
    *,
    between: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
) -> pa.Table:
    """``columns`` of the table at ``path`` (empty if there is none yet); with ``between``,
    only its rows whose bucket_start lies in one of those [first, last] spans (files and row
    groups outside are skipped by their statistics)."""
    names = columns or schema.names
    empty = pa.schema([schema.field(n) for n in names]).empty_table()
    if not is_delta(path, store):
        return empty
    if between is None:
        return open_delta(path, store).to_pyarrow_table(columns=names)
    if not between:
        return empty
    bucket = ds.field("bucket_start")
    kind = schema.field("bucket_start").type
    where = None
    for first, last in between:
        span = (bucket >= pa.scalar(first, kind)) & (bucket <= pa.scalar(last, kind))
        where = span if where is None else where | span
    table = open_delta(path, store)
    if table.metadata().partition_columns:
        return table.to_pyarrow_dataset().to_table(columns=names, filter=where)
    # The files whose bucket_start range (the log's statistics) meets a span, and only those
    # opened: a dataset of every file (delta-rs' to_pyarrow_dataset) costs time per file of
    # the table, which grows with its history (python -m bench passes).
    files = view_files.files_between(table, between)
    if not files:
        return empty
    filesystem, base = arrow_filesystem(path, store)
    paths = [f"{base.rstrip('/')}/{unquote(f.path)}" for f in files]
    read = pa.schema(
        [field for field in pa.schema(table.schema().to_arrow()) if field.name in names]
    )
    dataset = ds.dataset(paths, schema=read, format="parquet", filesystem=filesystem)
    return dataset.to_table(columns=names, filter=where).cast(empty.schema)
