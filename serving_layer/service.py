"""The serving layer: CTR queries over one consistent snapshot of the batch and speed views.

Each request pins a :class:`~serving_layer.tables.LakeSnapshot` and queries that snapshot's
relations (:class:`~serving_layer.relations.RelationCache`: one DuckDB relation per table
version) through a cursor of its own, so concurrent requests never block each other and never
see a half-written table. This module turns rows into answers: the merge rule's rows with
provenance and Wilson intervals, freshness, what each view holds.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import duckdb

from lake.catalog import batch_table
from lake.coverage import Coverage, CoveredInterval, Source, source_of
from lake.registry import Registry
from lake.settings import LakeSettings
from lake.staleness import (
    StaleBucket,
    StaleInterval,
    stale_buckets,
    stale_buckets_sql,
    stale_intervals,
    stale_marks_sql,
    stale_sql,
)
from serving_layer.freshness import Freshness
from serving_layer.query import (
    MAX_PREDICATE_INTERVALS,
    CtrQuery,
    ctr_sql,
    merged_sql,
    side_rows_sql,
)
from serving_layer.relations import RelationCache
from serving_layer.tables import LakeSnapshot, SnapshotSource, TableSnapshot
from serving_layer.wilson import wilson_interval
from views.columns import DIMENSIONS, MEASURES
from views.definitions import Definition, definition, versions

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class QueryLimitError(RuntimeError):
    """A query was stopped at a resource limit (time or memory): ask for less."""


@dataclass(frozen=True)
class CtrRow:
    bucket_start: dt.datetime
    dimensions: dict[str, str | None]
    impressions: int
    clicks: int  # with attribution: impressions clicked (<= impressions)
    raw_clicks: int  # every click event; the clicks without attribution
    orphan_clicks: int | None  # clicks without an impression in the window; None: no attribution
    repeat_clicks: int | None  # clicks on an impression after its first; None: no attribution
    ctr: float | None
    ctr_ci_low: float | None
    ctr_ci_high: float | None
    source: Source
    covered_fraction: float  # of the bucket's minutes in the query's range
    stale_events: int
    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class CtrResult:
    query: CtrQuery
    rows: list[CtrRow]
    truncated: bool
    freshness: Freshness
    view: Definition


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
class VersionInfo:
    version: int
    summary: str
    where: str | None
    state: str
    covered_intervals: tuple[CoveredInterval, ...]
    runs: int
    rows: int


@dataclass(frozen=True)
class ViewInfo:
    name: str
    version: int  # the published one, which the other fields describe
    versions: tuple[VersionInfo, ...]
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
        timeout_s: float | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"'timeout_s' must be > 0, got {timeout_s}")
        self.lake = lake
        self.timeout_s = timeout_s
        self.snapshots = SnapshotSource(lake, refresh_s=refresh_s, max_stale_s=max_stale_s)
        self.relations = RelationCache(threads=threads, memory_limit_bytes=memory_limit_bytes)

    def close(self) -> None:
        self.snapshots.close()
        self.relations.close()

    def snapshot(self) -> LakeSnapshot:
        return self.snapshots.current()

    # -- queries ----------------------------------------------------------------------------

    def registry(self, snapshot: LakeSnapshot | None = None) -> Registry:
        """The snapshot's view registry (which version of each view is published)."""
        snap = snapshot or self.snapshot()

        def load(name: str) -> Registry:
            with self.cursor() as cur:
                result = cur.execute(f"SELECT * FROM {name}")
                columns = [c[0] for c in result.description]
                rows = [dict(zip(columns, row, strict=True)) for row in result.fetchall()]
            return Registry.from_rows(rows)

        return self.relations.derived(snap["views/registry"], "registry", load)

    def definition(
        self, snapshot: LakeSnapshot, version: int | None = None, view: str = "ctr"
    ) -> Definition:
        """``version`` of ``view`` (:class:`UnknownVersionError` if there is none), or the
        version the snapshot's registry publishes."""
        if version is None:
            return self.registry(snapshot).published(view)
        return definition(view, version)

    def ctr_statement(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> tuple[str, dict[str, object]]:
        """The SQL and bound parameters that answer ``query`` for ``view`` over ``snapshot``
        (:func:`serving_layer.query.ctr_sql` over the snapshot's relations)."""
        within = self.coverage(snapshot, view).within(query.start, query.end)
        return ctr_sql(
            query,
            **self.sides(snapshot, view),
            covered=self._covered_relation(snapshot["batch/coverage"], view.key),
            stale=self._stale_relation(snapshot, view),
            intervals=within if len(within) <= MAX_PREDICATE_INTERVALS else None,
            marks=self._marks_relation(snapshot, view),
        )

    def ctr(
        self, query: CtrQuery, snapshot: LakeSnapshot | None = None, version: int | None = None
    ) -> CtrResult:
        """Rows of ``query`` by the merge rule, with provenance and Wilson intervals, from the
        published version of the view (or ``version``)."""
        snap = snapshot or self.snapshot()
        view = self.definition(snap, version)
        coverage = self.coverage(snap, view)
        sql, params = self.ctr_statement(query, snap, view)
        fetched = self._fetch_all(sql, params)
        truncated = len(fetched) > query.limit
        groups = query.group_by
        # Grouped answers repeat each bucket once per group: its start and coverage once.
        buckets: dict[int, tuple[dt.datetime, float]] = {}
        rows = []
        for record in fetched[: query.limit]:
            bucket_us = record[0]
            if bucket_us not in buckets:
                start = _EPOCH + dt.timedelta(microseconds=bucket_us)
                buckets[bucket_us] = (start, coverage.fraction(*query.bucket(start)))
            bucket, fraction = buckets[bucket_us]
            impressions, clicks, raw_clicks, orphans, repeats, ctr, stale_events, run_ids = record[
                -8:
            ]
            interval = wilson_interval(clicks, impressions)
            source = source_of(fraction)
            if stale_events and source == "batch":
                source = "stale"
            rows.append(
                CtrRow(
                    bucket_start=bucket,
                    dimensions=dict(zip(groups, record[1 : 1 + len(groups)], strict=True)),
                    impressions=impressions,
                    clicks=clicks,
                    raw_clicks=raw_clicks,
                    orphan_clicks=orphans,
                    repeat_clicks=repeats,
                    ctr=ctr,
                    ctr_ci_low=interval[0] if interval else None,
                    ctr_ci_high=interval[1] if interval else None,
                    source=source,
                    covered_fraction=fraction,
                    stale_events=int(stale_events or 0),
                    run_ids=tuple(run_ids or ()),
                )
            )
        return CtrResult(query, rows, truncated, self.freshness(snap, view), view)

    def freshness(
        self, snapshot: LakeSnapshot | None = None, view: Definition | None = None
    ) -> Freshness:
        snap = snapshot or self.snapshot()
        view = view or self.definition(snap)
        status = snap.status
        return Freshness(
            latest_covered_bucket=self.coverage(snap, view).latest_bucket,
            latest_speed_bucket=self._latest_speed_bucket(snap["speed/ctr"]),
            speed_updated_at=status.updated_at if status else None,
            speed_watermark=status.watermark if status else None,
            speed_lag_records=status.offsets_behind if status else None,
            versions={
                name: snap[name].version
                for name in (
                    batch_table(view).name,
                    "batch/coverage",
                    "speed/ctr",
                    "master/arrivals",
                    "views/registry",
                )
            },
        )

    def views(self, snapshot: LakeSnapshot | None = None) -> list[ViewInfo]:
        snap = snapshot or self.snapshot()
        registry = self.registry(snap)
        view = registry.published("ctr")
        coverage = self.coverage(snap, view)
        return [
            ViewInfo(
                name="ctr",
                version=view.version,
                covered_intervals=tuple(coverage.intervals),
                runs=self.runs(snap, view),
                latest_covered_bucket=coverage.latest_bucket,
                latest_speed_bucket=self._latest_speed_bucket(snap["speed/ctr"]),
                versions=tuple(self.version_info(snap, d, registry) for d in versions("ctr")),
                tables={
                    "batch": self.table_info(snap[batch_table(view).name]),
                    "speed": self.table_info(snap["speed/ctr"]),
                    "coverage": self.table_info(snap["batch/coverage"]),
                    "arrivals": self.table_info(snap["master/arrivals"]),
                    "drift": self.table_info(snap["batch/drift"]),
                },
                stale_intervals=tuple(stale_intervals(self.stale_buckets(snap, view))),
                drift=self.drift(snap, view),
            )
        ]

    def merged_relation(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """The merge rule of ``view`` at minute grain over the snapshot, as a SELECT (columns
        of :func:`serving_layer.query.merged_sql`)."""
        return merged_sql(
            batch=self._batch_relation(snapshot, view),
            speed=self._speed_relation(snapshot["speed/ctr"], view, per_key=True),
            covered=self._covered_relation(snapshot["batch/coverage"], view.key),
            stale=self._stale_relation(snapshot, view),
        )

    def runs(self, snapshot: LakeSnapshot, view: Definition) -> int:
        """Batch runs recorded for ``view``."""

        def count(name: str) -> int:
            with self.cursor() as cur:
                row = cur.execute(
                    f"SELECT count(DISTINCT run_id) FROM {name} WHERE view = $key",
                    {"key": view.key},
                ).fetchone()
            return int(row[0]) if row else 0

        return self.relations.derived(snapshot["batch/coverage"], f"runs:{view.key}", count)

    def version_info(
        self, snapshot: LakeSnapshot, view: Definition, registry: Registry | None = None
    ) -> VersionInfo:
        """One version of a view: its definition, state, coverage and rows."""
        registry = registry or self.registry(snapshot)
        coverage = self.coverage(snapshot, view)
        return VersionInfo(
            version=view.version,
            summary=view.summary,
            where=view.where,
            state=registry.state(view.view, view.version),
            covered_intervals=tuple(coverage.intervals),
            runs=self.runs(snapshot, view),
            rows=self.table_info(snapshot[batch_table(view).name]).rows,
        )

    def stale_buckets(
        self, snapshot: LakeSnapshot | None = None, view: Definition | None = None
    ) -> list[StaleBucket]:
        """Covered minutes with arrivals no batch run has counted, oldest first (of ``view``,
        default the published version)."""
        snap = snapshot or self.snapshot()
        view = view or self.definition(snap)
        stale = self._stale_relation(snap, view)
        marks = self._marks_relation(snap, view)

        def load(_: str) -> list[StaleBucket]:
            with self.cursor() as cur:
                rows = cur.execute(stale_buckets_sql(stale, marks=marks)).fetchall()
            return stale_buckets(rows)

        batch_version = snap[batch_table(view).name].version
        key = f"stale_buckets:{view.key}@{snap['batch/coverage'].version}:{batch_version}"
        return self.relations.derived(snap["master/arrivals"], key, load)

    def drift(
        self, snapshot: LakeSnapshot | None = None, view: Definition | None = None
    ) -> DriftSummary:
        """The drift of the latest :data:`DRIFT_RUNS` runs of ``view`` (default: the published
        version) that recorded some."""
        snap = snapshot or self.snapshot()
        key = (view or self.definition(snap)).key

        def load(name: str) -> DriftSummary:
            with self.cursor() as cur:
                row = cur.execute(drift_summary_sql(name, DRIFT_RUNS), {"key": key}).fetchone()
            assert row is not None
            runs, buckets, i50, i99, c50, c99, d_impressions, d_clicks = row
            return DriftSummary(
                int(runs), int(buckets), i50, i99, c50, c99, int(d_impressions), int(d_clicks)
            )

        return self.relations.derived(snap["batch/drift"], f"summary:{key}", load)

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

    def coverage(self, snapshot: LakeSnapshot, view: Definition | None = None) -> Coverage:
        """The covered intervals of the snapshot's ``batch/coverage``, merged, for ``view``
        (default: the published version)."""
        view = view or self.definition(snapshot)
        return self._coverage(snapshot["batch/coverage"], view.key)

    def _coverage(self, table: TableSnapshot, key: str) -> Coverage:
        def load(name: str) -> Coverage:
            with self.cursor() as cur:
                rows = cur.execute(
                    f"SELECT interval_start, interval_end FROM {name} WHERE view = $key",
                    {"key": key},
                ).fetchall()
            return Coverage((s.astimezone(dt.UTC), e.astimezone(dt.UTC)) for s, e in rows)

        return self.relations.derived(table, f"coverage:{key}", load)

    def cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return self.relations.cursor()

    def _fetch_all(self, sql: str, params: dict[str, object]) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, interrupted at ``timeout_s``; :class:`QueryLimitError` when it
        is stopped there or runs out of the database's memory."""
        with self.cursor() as cur:
            timer = None
            if self.timeout_s is not None:
                timer = threading.Timer(self.timeout_s, cur.interrupt)
                timer.daemon = True
                timer.start()
            try:
                return cur.execute(sql, params).fetchall()
            except duckdb.InterruptException:
                raise QueryLimitError(
                    f"the query was stopped at the time limit of {self.timeout_s:g} s: ask for "
                    "a shorter range, a coarser granularity or fewer group_by dimensions"
                ) from None
            except duckdb.OutOfMemoryException:
                raise QueryLimitError(
                    "the query needs more memory than the server allows: ask for a shorter "
                    "range, a coarser granularity or fewer group_by dimensions"
                ) from None
            finally:
                if timer is not None:
                    timer.cancel()

    def relation_name(self, table: TableSnapshot) -> str:
        return self.relations.relation(table).name

    def sides(self, snapshot: LakeSnapshot, view: Definition | None = None) -> dict[str, str]:
        """The ``batch`` and ``speed`` relations :func:`serving_layer.query.ctr_sql` reads for
        ``view`` (default: the published version): its tables' rows with the five counts of
        :data:`views.columns.MEASURES` (a table's own relation lacks some)."""
        view = view or self.definition(snapshot)
        return {
            "batch": self._batch_relation(snapshot, view),
            "speed": self._speed_relation(snapshot["speed/ctr"], view),
        }

    def _covered_relation(self, table: TableSnapshot, key: str) -> str:
        def create(name: str) -> str:
            covered = f"covered_{name}_{_suffix(key)}"
            coverage = self._coverage(table, key)
            self.relations.create_table(covered, coverage.to_arrow(), owner=table)
            return covered

        return self.relations.derived(table, f"covered:{key}", create)

    def _filtered(self, table: TableSnapshot, view: Definition) -> str:
        """``table``'s rows that ``view`` counts (its ``where``), as a relation name."""
        where = view.where
        if where is None:
            return self.relations.relation(table).name

        def create(base: str) -> str:
            filtered = f"{base}_{_suffix(view.key)}"
            self.relations.create_table(
                filtered, f"SELECT * FROM {base} WHERE {where}", owner=table
            )
            return filtered

        return self.relations.derived(table, f"filtered:{view.key}", create)

    def _columns(self, table: TableSnapshot) -> frozenset[str]:
        """The columns ``table``'s relation has (a table written before a column was added to
        its schema lacks it)."""

        def load(name: str) -> frozenset[str]:
            with self.cursor() as cur:
                rows = cur.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE table_name = $name",
                    {"name": name},
                ).fetchall()
            return frozenset(str(r[0]) for r in rows)

        return self.relations.derived(table, "columns", load)

    def _batch_relation(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """``view``'s batch rows with the five counts of :data:`views.columns.MEASURES`: its
        table's relation, or a projection of it (a version without attribution)."""
        table = snapshot[batch_table(view).name]
        name = self.relations.relation(table).name
        columns = self._columns(table)
        if view.attribution is not None and columns >= set(MEASURES):
            return name
        sql = side_rows_sql(
            name, columns=columns, attribution=view.attribution is not None, speed=False
        )
        return f"({sql})"

    def _speed_relation(
        self, table: TableSnapshot, view: Definition, *, per_key: bool = False
    ) -> str:
        """``table``'s (speed/ctr's) rows that ``view`` counts (its ``where``), with the five
        counts of :data:`views.columns.MEASURES` as ``view`` counts them
        (:func:`serving_layer.query.side_rows_sql`): a relation name or a parenthesized SELECT.

        ``per_key``: one row per key (speed/ctr holds partial counts, several rows per key
        until the speed job rolls them up), for readers that match rows by key; the CTR query
        sums them anyway and reads the rows as stored (a filtered version's rows are copied
        once per table version)."""
        base = self.relations.relation(table).name
        rows = side_rows_sql(
            base,
            columns=self._columns(table),
            attribution=view.attribution is not None,
            speed=True,
            where=view.where,
        )
        if view.where is None and not per_key:
            return f"({rows})"

        def create(_: str) -> str:
            served = f"{base}_{'keyed_' if per_key else ''}{_suffix(view.key)}"
            select = rows
            if per_key:
                key = ", ".join(["bucket_start", *DIMENSIONS])
                sums = ", ".join(f"sum({m})::BIGINT AS {m}" for m in MEASURES)
                select = f"SELECT {key}, {sums} FROM ({rows}) GROUP BY {key}"
            self.relations.create_table(served, select, owner=table)
            return served

        return self.relations.derived(
            table, f"{'keyed:' if per_key else ''}served:{view.key}", create
        )

    def _stale_relation(self, snap: LakeSnapshot, view: Definition | None = None) -> str:
        """The snapshot's uncounted arrivals (:func:`lake.staleness.stale_sql`) for ``view``
        as a small in-memory table, computed once per version of master/arrivals and
        batch/coverage."""
        view = view or self.definition(snap)
        return self._arrivals_relation(
            snap, view, "stale", partial(stale_sql, attribution=view.attribution)
        )

    def _marks_relation(self, snap: LakeSnapshot, view: Definition) -> str | None:
        """For a version with click attribution, the covered minutes that late events in other
        minutes may change (:func:`lake.staleness.stale_marks_sql`) as a small in-memory table,
        computed once per version of master/arrivals, batch/coverage and the batch table;
        None without attribution."""
        if view.attribution is None:
            return None
        return self._arrivals_relation(
            snap, view, "marks", partial(stale_marks_sql, attribution=view.attribution)
        )

    def _arrivals_relation(
        self, snap: LakeSnapshot, view: Definition, kind: str, select: Callable[..., str]
    ) -> str:
        """``select`` (a rule of :mod:`lake.staleness` over the arrivals ``view`` counts,
        batch/coverage and the version's batch rows) as an in-memory table named after
        ``kind``, computed once per version of the three tables."""
        arrivals, coverage = snap["master/arrivals"], snap["batch/coverage"]
        batch = snap[batch_table(view).name]
        coverage_name = self.relations.relation(coverage).name
        batch_name = self.relations.relation(batch).name
        source = self._filtered(arrivals, view)

        def create(name: str) -> str:
            table = f"{kind}_{name}_{coverage_name}_{batch_name}"
            sql = select(arrivals=source, coverage=coverage_name, batch=batch_name, view=view.key)
            self.relations.create_table(table, sql, owner=arrivals)
            return table

        return self.relations.derived(
            arrivals, f"{kind}:{view.key}@{coverage.version}:{batch.version}", create
        )

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
    speed-minus-batch differences; the view key is the bound parameter ``$key``."""
    impressions = "abs(speed_impressions - batch_impressions) / batch_impressions"
    clicks = "abs(speed_clicks - batch_clicks) / batch_clicks"
    return f"""
        WITH recent AS (
            SELECT run_id FROM {drift} WHERE view = $key
            GROUP BY run_id ORDER BY max(recorded_at) DESC, run_id LIMIT {int(runs)}
        )
        SELECT count(DISTINCT run_id), count(*),
               quantile_cont({impressions}, 0.5) FILTER (WHERE batch_impressions > 0),
               quantile_cont({impressions}, 0.99) FILTER (WHERE batch_impressions > 0),
               quantile_cont({clicks}, 0.5) FILTER (WHERE batch_clicks > 0),
               quantile_cont({clicks}, 0.99) FILTER (WHERE batch_clicks > 0),
               coalesce(sum(speed_impressions - batch_impressions), 0),
               coalesce(sum(speed_clicks - batch_clicks), 0)
        FROM {drift} WHERE view = $key AND run_id IN (SELECT run_id FROM recent)
    """


def _suffix(key: str) -> str:
    """A view key as part of a DuckDB name: ``ctr@v2`` -> ``ctr_v2``."""
    return key.replace("@", "_")
