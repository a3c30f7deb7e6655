"""The serving layer: CTR queries over one consistent snapshot of the batch and speed views.

One in-memory DuckDB database holds a relation per (table, version) the requests use: a view
over the version's Parquet files for ``batch/ctr`` (large, changes hourly) and in-memory copies
of ``speed/ctr`` and ``batch/coverage`` (small; the speed table changes every second). Each
request pins a :class:`~serving_layer.tables.LakeSnapshot` and queries that snapshot's
relations through a cursor of its own, so concurrent requests never block each other and
never see a half-written table. Relations of superseded versions are dropped a while later.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import duckdb

from lake.catalog import SERVED
from lake.coverage import Coverage, CoveredInterval, Source
from lake.settings import LakeSettings
from serving_layer.freshness import Freshness
from serving_layer.query import MAX_PREDICATE_INTERVALS, CtrQuery, ctr_sql
from serving_layer.relations import create_arrow_table, create_relation
from serving_layer.tables import LakeSnapshot, SnapshotSource, TableSnapshot
from serving_layer.wilson import wilson_interval

# DuckDB names: fixed prefixes plus a version number, never request text.
_PREFIX: Final = {t.name: t.sql_name for t in SERVED}
_MATERIALIZED: Final = frozenset({"batch/coverage", "speed/ctr"})
# A superseded relation stays this long for requests that pinned it before it was replaced.
_GRACE_S: Final = 120.0
_T = TypeVar("_T")
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
class ViewInfo:
    name: str
    covered_intervals: tuple[CoveredInterval, ...]
    runs: int
    latest_covered_bucket: dt.datetime | None
    latest_speed_bucket: dt.datetime | None
    tables: dict[str, TableInfo]


@dataclass
class _Relation:
    name: str
    kind: str
    superseded_at: float | None = None
    derived: dict[str, object] = field(default_factory=dict)


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
        self._db = duckdb.connect(
            config={
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "threads": threads,
            }
        )
        self._db.execute("SET TimeZone = 'UTC'")
        self._db.execute("SET parquet_metadata_cache = true")
        self._lock = threading.Lock()
        self._derive_lock = threading.Lock()
        self._relations: dict[tuple[str, int | None], _Relation] = {}
        self._latest: dict[str, int | None] = {}

    def close(self) -> None:
        self._db.close()

    def snapshot(self) -> LakeSnapshot:
        return self.snapshots.current()

    # -- queries ----------------------------------------------------------------------------

    def ctr(self, query: CtrQuery, snapshot: LakeSnapshot | None = None) -> CtrResult:
        """Rows of ``query`` by the merge rule, with provenance and Wilson intervals."""
        snap = snapshot or self.snapshot()
        batch = self._relation(snap["batch/ctr"])
        speed = self._relation(snap["speed/ctr"])
        coverage = self.coverage(snap)
        covered = self._covered_relation(snap["batch/coverage"])
        within = coverage.within(query.start, query.end)
        sql, params = ctr_sql(
            query,
            batch=batch.name,
            speed=speed.name,
            covered=covered,
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
            impressions, clicks, ctr, run_ids = record[-4:]
            interval = wilson_interval(clicks, impressions)
            source = coverage.source(max(bucket, query.start), min(bucket + step, query.end))
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
        runs = self._derived(
            snap["batch/coverage"],
            "runs",
            lambda name: self._scalar(
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
                },
            )
        ]

    def table_info(self, table: TableSnapshot) -> TableInfo:
        rows = self._derived(
            table, "rows", lambda name: self._scalar(f"SELECT count(*) FROM {name}")
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

        return self._derived(snap["master/rejected"], "by_reason", count)

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

        return self._derived(table, "coverage", load)

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        cur = self._db.cursor()
        try:
            yield cur
        finally:
            cur.close()

    # -- relations per table version --------------------------------------------------------

    def relation_name(self, table: TableSnapshot) -> str:
        return self._relation(table).name

    def _relation(self, table: TableSnapshot) -> _Relation:
        key = (table.name, table.version)
        found = self._relations.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._relations.get(key)
            if found is not None:
                return found
            version = "missing" if table.version is None else f"v{table.version}"
            name = f"{_PREFIX[table.name]}_{version}"
            with self.cursor() as cur:
                kind = create_relation(cur, name, table, materialize=table.name in _MATERIALIZED)
            relation = _Relation(name, kind)
            self._relations[key] = relation
            self._retire(table.name, table.version)
            return relation

    def _covered_relation(self, table: TableSnapshot) -> str:
        def create(name: str) -> str:
            data = self._coverage(table).to_arrow()
            covered = f"covered_{name}"
            with self._lock, self.cursor() as cur:
                create_arrow_table(cur, covered, data)
            return covered

        return self._derived(table, "covered", create)

    def _latest_speed_bucket(self, table: TableSnapshot) -> dt.datetime | None:
        value = self._derived(
            table, "latest", lambda name: self._scalar(f"SELECT max(bucket_start) FROM {name}")
        )
        return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else None

    def _derived(self, table: TableSnapshot, what: str, compute: Callable[[str], _T]) -> _T:
        """A value computed once per table version (coverage intervals, row counts, …)."""
        relation = self._relation(table)
        if what not in relation.derived:
            # Once per version: concurrent first requests wait for one computation (some
            # computations create a named table, which a second attempt could not).
            with self._derive_lock:
                if what not in relation.derived:
                    relation.derived[what] = compute(relation.name)
        return cast(_T, relation.derived[what])

    def _scalar(self, sql: str) -> Any:
        with self.cursor() as cur:
            row = cur.execute(sql).fetchone()
        return row[0] if row else None

    def _retire(self, table: str, version: int | None) -> None:
        """Mark older versions of ``table`` superseded; drop those superseded long enough."""
        now = time.monotonic()
        newest = self._latest.get(table)
        if version is not None and (newest is None or version > newest):
            self._latest[table] = version
        for (name, v), relation in list(self._relations.items()):
            if name != table or v == self._latest.get(table):
                continue
            if relation.superseded_at is None:
                relation.superseded_at = now
            elif now - relation.superseded_at > _GRACE_S:
                with self.cursor() as cur:
                    cur.execute(f"DROP {relation.kind} IF EXISTS {relation.name}")
                    covered = relation.derived.get("covered")
                    if isinstance(covered, str):
                        cur.execute(f"DROP TABLE IF EXISTS {covered}")
                del self._relations[(name, v)]
