"""Which covered minute buckets received events after the batch run that made them exact.

A bucket is exact as of the master/events version the latest run covering it read (the largest
``input_version`` among the ``batch/coverage`` rows whose interval holds it). Arrivals
(:mod:`lake.arrivals`) of that bucket with a later ``events_version`` are events that run did
not count: the bucket is *stale* until a run recomputes it. :func:`stale_sql` is that rule,
written once, as DuckDB SQL over two relations; the serving layer runs it once per version of
``master/arrivals`` and ``batch/coverage`` (never per request), `ctr batch --stale` and the
``ctr_recompute_stale`` DAG run it over the tables read with delta-rs (:func:`read_stale`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from lake.catalog import BATCH_COVERAGE, MASTER_ARRIVALS
from lake.coverage import Coverage
from lake.settings import LakeSettings
from views.columns import DIMENSIONS

HOUR: Final = dt.timedelta(hours=1)
MINUTE: Final = dt.timedelta(minutes=1)


def stale_sql(*, arrivals: str, coverage: str) -> str:
    """SELECT of the arrivals rows no covering batch run has counted: bucket_start, the
    dimensions, impressions, clicks, stale_events (impressions + clicks), archived_at.

    ``arrivals`` and ``coverage`` are trusted relation names (``master/arrivals`` and
    ``batch/coverage`` rows); only covered buckets can be stale.
    """
    dims = ", ".join(f"a.{d}" for d in DIMENSIONS)
    return f"""
        WITH buckets AS (SELECT DISTINCT bucket_start FROM {arrivals}),
        exact AS (
            SELECT b.bucket_start, max(c.input_version) AS input_version
            FROM buckets b JOIN {coverage} c
              ON b.bucket_start >= c.interval_start AND b.bucket_start < c.interval_end
            WHERE c.view = 'ctr'
            GROUP BY b.bucket_start
        )
        SELECT a.bucket_start, {dims}, a.impressions, a.clicks,
               a.impressions + a.clicks AS stale_events, a.archived_at
        FROM {arrivals} a JOIN exact e ON a.bucket_start = e.bucket_start
        WHERE a.events_version > e.input_version
    """


def stale_buckets_sql(stale: str) -> str:
    """Per stale bucket of the relation ``stale`` (rows of :func:`stale_sql`): its stale events
    and when the oldest of them was archived, in bucket order."""
    return f"""
        SELECT bucket_start, sum(stale_events)::BIGINT, min(archived_at)
        FROM {stale} GROUP BY bucket_start ORDER BY bucket_start
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
    return [StaleBucket(_utc(bucket), int(events), _utc(first)) for bucket, events, first in rows]


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


def read_stale(lake: LakeSettings) -> tuple[list[StaleBucket], Coverage]:
    """The lake's stale buckets now, and its coverage: both tables read with delta-rs (no
    Spark), the rule run in DuckDB."""
    arrivals = _read(MASTER_ARRIVALS.path(lake), MASTER_ARRIVALS.schema)
    coverage_rows = _read(BATCH_COVERAGE.path(lake), BATCH_COVERAGE.schema)
    ctr_rows = coverage_rows.filter(pc.equal(coverage_rows["view"], "ctr"))
    coverage = Coverage(
        zip(
            (_utc(t) for t in ctr_rows["interval_start"].to_pylist()),
            (_utc(t) for t in ctr_rows["interval_end"].to_pylist()),
            strict=True,
        )
    )
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("arrivals", arrivals)
        con.register("coverage", coverage_rows)
        rows = con.execute(
            stale_buckets_sql(f"({stale_sql(arrivals='arrivals', coverage='coverage')})")
        ).fetchall()
    return stale_buckets(rows), coverage


def _read(path: str, schema: pa.Schema) -> pa.Table:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        return schema.empty_table()
    return DeltaTable(path).to_pyarrow_table(columns=schema.names)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
