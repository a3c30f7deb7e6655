"""The serving layer: CTR queries over one consistent snapshot of the batch and speed views.

Each request pins a :class:`~serving_layer.tables.LakeSnapshot` and queries that snapshot's
relations (:class:`~serving_layer.relations.RelationCache`: one DuckDB relation per table
version) through a cursor of its own, so concurrent requests never block each other and never
see a half-written table. This module turns rows into answers: the merge rule's rows with
provenance and Wilson intervals, freshness, what each view holds.
"""

from __future__ import annotations

import datetime as dt
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final

import duckdb

from lake.coverage import Coverage, CoveredInterval, Source
from lake.settings import LakeSettings
from lake.staleness import (
    StaleBucket,
    StaleInterval,
    stale_buckets,
    stale_buckets_sql,
    stale_intervals,
    stale_sql,
)
from serving_layer.freshness import Freshness
from serving_layer.query import MAX_PREDICATE_INTERVALS, CtrQuery, ctr_sql
from serving_layer.relations import RelationCache
from serving_layer.tables import LakeSnapshot, SnapshotSource, TableSnapshot
from serving_layer.wilson import wilson_interval

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class CtrRow:
    bucket_start: dt.datetime
    dimensions: dict[str, str | None]
    impressions: int
    clicks: int
    ctr: float | None
    ctr_ci_low: float | None
    ctr_ci_high: float | None
    source: Source
    stale_events: int
    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class CtrResult:
    query: CtrQuery
    rows: list[CtrRow]
    truncated: bool
    freshness: Freshness


@dataclass(frozen=True)
class TableInfo:
    table: str
    version: int | None
    rows: int
    files: int


@dataclass(frozen=True)
class DriftSummary:
    """How far the speed layer was from the batch layer in the minutes the latest runs covered
    for the first time: relative errors |speed - batch| / batch (buckets with batch > 0)."""

    runs: int
    buckets: int
    impressions_p50: float | None
    impressions_p99: float | None
    clicks_p50: float | None
    clicks_p99: float | None
    speed_minus_batch_impressions: int
    speed_minus_batch_clicks: int


@dataclass(frozen=True)
class ViewInfo:
    name: str
    covered_intervals: tuple[CoveredInterval, ...]
    runs: int
    latest_covered_bucket: dt.datetime | None
    latest_speed_bucket: dt.datetime | None
    tables: dict[str, TableInfo]
    stale_intervals: tuple[StaleInterval, ...]
    drift: DriftSummary


# Drift is summarised over the runs that recorded it most recently.
DRIFT_RUNS: Final = 24


class ServingLayer:
    """CTR answers over the lake; thread-safe, one instance per process."""

    def __init__(
        self,
        lake: LakeSettings,
        *,
        refresh_s: float = 0.5,
        max_stale_s: float = 0.0,
        threads: int = 2,
    ) -> None:
        self.lake = lake
        self.snapshots = SnapshotSource(lake, refresh_s=refresh_s, max_stale_s=max_stale_s)
        self.relations = RelationCache(threads=threads)

    def close(self) -> None:
        self.relations.close()

    def snapshot(self) -> LakeSnapshot:
        return self.snapshots.current()

    # -- queries ----------------------------------------------------------------------------

    def ctr(self, query: CtrQuery, snapshot: LakeSnapshot | None = None) -> CtrResult:
        """Rows of ``query`` by the merge rule, with provenance and Wilson intervals."""
        snap = snapshot or self.snapshot()
        batch = self.relations.relation(snap["batch/ctr"])
        speed = self.relations.relation(snap["speed/ctr"])
        coverage = self.coverage(snap)
        covered = self._covered_relation(snap["batch/coverage"])
        within = coverage.within(query.start, query.end)
        sql, params = ctr_sql(
            query,
            batch=batch.name,
            speed=speed.name,
            covered=covered,
            stale=self._stale_relation(snap),
            intervals=within if len(within) <= MAX_PREDICATE_INTERVALS else None,
        )
        with self.cursor() as cur:
            fetched = cur.execute(sql, params).fetchall()
        truncated = len(fetched) > query.limit
        step = query.step
        groups = query.group_by
        rows = []
        for record in fetched[: query.limit]:
            bucket = _EPOCH + dt.timedelta(microseconds=record[0])
            impressions, clicks, ctr, stale_events, run_ids = record[-5:]
            interval = wilson_interval(clicks, impressions)
            source = coverage.source(max(bucket, query.start), min(bucket + step, query.end))
            if stale_events and source == "batch":
                source = "stale"
            rows.append(
                CtrRow(
                    bucket_start=bucket,
                    dimensions=dict(zip(groups, record[1 : 1 + len(groups)], strict=True)),
                    impressions=impressions,
                    clicks=clicks,
                    ctr=ctr,
                    ctr_ci_low=interval[0] if interval else None,
                    ctr_ci_high=interval[1] if interval else None,
                    source=source,
                    stale_events=int(stale_events or 0),
                    run_ids=tuple(run_ids or ()),
                )
            )
        return CtrResult(query, rows, truncated, self.freshness(snap))

    def freshness(self, snapshot: LakeSnapshot | None = None) -> Freshness:
        snap = snapshot or self.snapshot()
        status = snap.status
        return Freshness(
            latest_covered_bucket=self.coverage(snap).latest_bucket,
            latest_speed_bucket=self._latest_speed_bucket(snap["speed/ctr"]),
            speed_updated_at=status.updated_at if status else None,
            speed_watermark=status.watermark if status else None,
            speed_lag_records=status.offsets_behind if status else None,
            versions={
                name: snap[name].version for name in ("batch/ctr", "batch/coverage", "speed/ctr")
            },
        )

    def views(self, snapshot: LakeSnapshot | None = None) -> list[ViewInfo]:
        snap = snapshot or self.snapshot()
        coverage = self.coverage(snap)
        runs = self.relations.derived(
            snap["batch/coverage"],
            "runs",
            lambda name: self.relations.scalar(
                f"SELECT count(DISTINCT run_id) FROM {name} WHERE view = 'ctr'"
            ),
        )
        return [
            ViewInfo(
                name="ctr",
                covered_intervals=tuple(coverage.intervals),
                runs=int(runs or 0),
                latest_covered_bucket=coverage.latest_bucket,
                latest_speed_bucket=self._latest_speed_bucket(snap["speed/ctr"]),
                tables={
                    "batch": self.table_info(snap["batch/ctr"]),
                    "speed": self.table_info(snap["speed/ctr"]),
                    "coverage": self.table_info(snap["batch/coverage"]),
                    "arrivals": self.table_info(snap["master/arrivals"]),
                    "drift": self.table_info(snap["batch/drift"]),
                },
                stale_intervals=tuple(stale_intervals(self.stale_buckets(snap))),
                drift=self.drift(snap),
            )
        ]

    def stale_buckets(self, snapshot: LakeSnapshot | None = None) -> list[StaleBucket]:
        """Covered minutes with arrivals no batch run has counted, oldest first."""
        snap = snapshot or self.snapshot()
        stale = self._stale_relation(snap)

        def load(_: str) -> list[StaleBucket]:
            with self.cursor() as cur:
                return stale_buckets(cur.execute(stale_buckets_sql(stale)).fetchall())

        return self.relations.derived(
            snap["master/arrivals"], f"stale_buckets@{snap['batch/coverage'].version}", load
        )

    def drift(self, snapshot: LakeSnapshot | None = None) -> DriftSummary:
        """The drift of the latest :data:`DRIFT_RUNS` runs that recorded some."""
        snap = snapshot or self.snapshot()

        def load(name: str) -> DriftSummary:
            with self.cursor() as cur:
                row = cur.execute(drift_summary_sql(name, DRIFT_RUNS)).fetchone()
            assert row is not None
            runs, buckets, i50, i99, c50, c99, d_impressions, d_clicks = row
            return DriftSummary(
                int(runs), int(buckets), i50, i99, c50, c99, int(d_impressions), int(d_clicks)
            )

        return self.relations.derived(snap["batch/drift"], "summary", load)

    def table_info(self, table: TableSnapshot) -> TableInfo:
        rows = self.relations.derived(
            table, "rows", lambda name: self.relations.scalar(f"SELECT count(*) FROM {name}")
        )
        return TableInfo(table.name, table.version, int(rows or 0), len(table.files))

    def rejected_by_reason(self, snapshot: LakeSnapshot | None = None) -> dict[str, int]:
        """Quarantined records per reason kind: the field a reason names (``country``, …)."""
        snap = snapshot or self.snapshot()

        def count(name: str) -> dict[str, int]:
            with self.cursor() as cur:
                rows = cur.execute(
                    f"SELECT split_part(reason, ':', 1) AS kind, count(*) FROM {name} "
                    "GROUP BY kind ORDER BY kind"
                ).fetchall()
            return {str(kind): int(n) for kind, n in rows}

        return self.relations.derived(snap["master/rejected"], "by_reason", count)

    def coverage(self, snapshot: LakeSnapshot) -> Coverage:
        """The covered intervals of the snapshot's ``batch/coverage``, merged."""
        return self._coverage(snapshot["batch/coverage"])

    def _coverage(self, table: TableSnapshot) -> Coverage:
        def load(name: str) -> Coverage:
            with self.cursor() as cur:
                rows = cur.execute(
                    f"SELECT interval_start, interval_end FROM {name} WHERE view = 'ctr'"
                ).fetchall()
            return Coverage((s.astimezone(dt.UTC), e.astimezone(dt.UTC)) for s, e in rows)

        return self.relations.derived(table, "coverage", load)

    def cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return self.relations.cursor()

    def relation_name(self, table: TableSnapshot) -> str:
        return self.relations.relation(table).name

    def _covered_relation(self, table: TableSnapshot) -> str:
        def create(name: str) -> str:
            covered = f"covered_{name}"
            self.relations.create_table(covered, self._coverage(table).to_arrow(), owner=table)
            return covered

        return self.relations.derived(table, "covered", create)

    def _stale_relation(self, snap: LakeSnapshot) -> str:
        """The snapshot's uncounted arrivals (:func:`lake.staleness.stale_sql`) as a small
        in-memory table, computed once per version of master/arrivals and batch/coverage."""
        arrivals, coverage = snap["master/arrivals"], snap["batch/coverage"]
        coverage_name = self.relations.relation(coverage).name

        def create(name: str) -> str:
            stale = f"stale_{name}_{coverage_name}"
            sql = stale_sql(arrivals=name, coverage=coverage_name)
            self.relations.create_table(stale, sql, owner=arrivals)
            return stale

        return self.relations.derived(arrivals, f"stale@{coverage.version}", create)

    def _latest_speed_bucket(self, table: TableSnapshot) -> dt.datetime | None:
        value = self.relations.derived(
            table,
            "latest",
            lambda name: self.relations.scalar(f"SELECT max(bucket_start) FROM {name}"),
        )
        return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else None


def drift_summary_sql(drift: str, runs: int) -> str:
    """One row summarising ``drift`` (``batch/drift`` rows) over its latest ``runs`` runs: runs,
    buckets, p50 and p99 of the relative error of impressions and of clicks, and the summed
    speed-minus-batch differences."""
    impressions = "abs(speed_impressions - batch_impressions) / batch_impressions"
    clicks = "abs(speed_clicks - batch_clicks) / batch_clicks"
    return f"""
        WITH recent AS (
            SELECT run_id FROM {drift} WHERE view = 'ctr'
            GROUP BY run_id ORDER BY max(recorded_at) DESC, run_id LIMIT {int(runs)}
        )
        SELECT count(DISTINCT run_id), count(*),
               quantile_cont({impressions}, 0.5) FILTER (WHERE batch_impressions > 0),
               quantile_cont({impressions}, 0.99) FILTER (WHERE batch_impressions > 0),
               quantile_cont({clicks}, 0.5) FILTER (WHERE batch_clicks > 0),
               quantile_cont({clicks}, 0.99) FILTER (WHERE batch_clicks > 0),
               coalesce(sum(speed_impressions - batch_impressions), 0),
               coalesce(sum(speed_clicks - batch_clicks), 0)
        FROM {drift} WHERE view = 'ctr' AND run_id IN (SELECT run_id FROM recent)
    """
