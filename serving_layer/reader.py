"""Reading one consistent snapshot of the lake for a view version: what both the CTR answers
(:mod:`serving_layer.service`) and the inventory (:mod:`serving_layer.inventory`) read.

Each request pins a :class:`~serving_layer.snapshots.LakeSnapshot` and queries that snapshot's
relations (:class:`~serving_layer.relations.RelationCache`: one DuckDB relation per table
version) through a cursor of its own, so concurrent requests never block each other and never
see a half-written table. On top of the tables' own relations, this builds once per table
version what every reader of a view version needs: its registry and coverage, its batch and
speed sides with the five counts (:mod:`serving_layer.sides`), its covered intervals and its
stale arrivals.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import duckdb

from lake.catalog import BATCH_COVERAGE, MASTER_ARRIVALS, SPEED_CTR, VIEW_REGISTRY, batch_table
from lake.coverage.log import runs_from_duckdb
from lake.coverage.model import Coverage, CoverageRuns
from lake.coverage.staleness import stale_marks_sql, stale_sql
from lake.registry import Registry
from lake.settings import LakeSettings
from serving_layer.errors import ServingError
from serving_layer.merge_rule import merged_sql
from serving_layer.relations import RelationCache
from serving_layer.sides import VersionSides, view_suffix
from serving_layer.snapshots import LakeSnapshot, SnapshotSource, TableSnapshot
from views.definitions import Definition, definition


class QueryLimitError(ServingError, RuntimeError):
    """A query was stopped at a resource limit (time or memory): ask for less."""


class QueryTimeLimitError(QueryLimitError):
    """A query was stopped at the time limit: the server's doing as much as the query's (a
    busy machine is slower), so worth asking again later."""


class SnapshotReader:
    """A view version's relations over lake snapshots; thread-safe, one instance per process."""

    def __init__(
        self,
        lake: LakeSettings,
        *,
        refresh_s: float = 0.5,
        seldom_s: float | None = None,
        max_stale_s: float = 0.0,
        threads: int = 2,
        timeout_s: float | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"'timeout_s' must be > 0, got {timeout_s}")
        self.lake = lake
        self.timeout_s = timeout_s
        self.snapshots = SnapshotSource(
            lake, refresh_s=refresh_s, seldom_s=seldom_s, max_stale_s=max_stale_s
        )
        self.relations = RelationCache(
            lake.object_store, threads=threads, memory_limit_bytes=memory_limit_bytes
        )
        self.version_sides = VersionSides(self.relations)

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

        return self.relations.derived(snap[VIEW_REGISTRY], "registry", load)

    def definition(
        self, snapshot: LakeSnapshot, version: int | None = None, view: str = "ctr"
    ) -> Definition:
        """``version`` of ``view`` (:class:`UnknownVersionError` if there is none), or the
        version the snapshot's registry publishes."""
        if version is None:
            return self.registry(snapshot).published(view)
        return definition(view, version)

    def coverage_runs(self, snapshot: LakeSnapshot) -> CoverageRuns:
        """The runs of the snapshot's ``batch/coverage`` (read once per table version)."""

        def load(name: str) -> CoverageRuns:
            with self.cursor() as cur:
                return runs_from_duckdb(cur, name)

        return self.relations.derived(snapshot[BATCH_COVERAGE], "runs", load)

    def coverage(self, snapshot: LakeSnapshot, view: Definition | None = None) -> Coverage:
        """The covered intervals of the snapshot's ``batch/coverage``, merged, for ``view``
        (default: the published version)."""
        view = view or self.definition(snapshot)
        return self.coverage_runs(snapshot).of(view.key)

    def cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return self.relations.cursor()

    def fetch_all(
        self, sql: str, params: dict[str, object]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The column names and rows of ``sql``, interrupted at ``timeout_s``;
        :class:`QueryLimitError` when it is stopped there or runs out of the database's
        memory."""
        with self.cursor() as cur:
            done = threading.Event()
            if self.timeout_s is not None:
                threading.Thread(
                    target=_interrupt_until_done, args=(cur, self.timeout_s, done), daemon=True
                ).start()
            try:
                result = cur.execute(sql, params)
                rows = result.fetchall()
                return [d[0] for d in result.description], rows
            except duckdb.InterruptException:
                raise QueryTimeLimitError(
                    f"the query was stopped at the time limit of {self.timeout_s:g} s: ask for "
                    "a shorter range, a coarser granularity or fewer group_by dimensions"
                ) from None
            except duckdb.OutOfMemoryException:
                raise QueryLimitError(
                    "the query needs more memory than the server allows: ask for a shorter "
                    "range, a coarser granularity or fewer group_by dimensions"
                ) from None
            finally:
                done.set()

    def relation_name(self, table: TableSnapshot) -> str:
        return self.relations.relation(table).name

    def sides(self, snapshot: LakeSnapshot, view: Definition | None = None) -> dict[str, str]:
        """The ``batch`` and ``speed`` relations :func:`serving_layer.ctr_sql.ctr_sql` reads for
        ``view`` (default: the published version): its tables' rows with the five counts of
        :data:`views.columns.MEASURES` (a table's own relation lacks some)."""
        view = view or self.definition(snapshot)
        return {
            "batch": self.version_sides.batch(snapshot, view),
            "speed": self.version_sides.speed(snapshot[SPEED_CTR], view),
        }

    def merged_relation(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """The merge rule of ``view`` at minute grain over the snapshot, as a SELECT (columns
        of :func:`serving_layer.merge_rule.merged_sql`)."""
        return merged_sql(
            batch=self.version_sides.batch(snapshot, view),
            speed=self.version_sides.speed(snapshot[SPEED_CTR], view, per_key=True),
            covered=self.covered_relation(snapshot, view),
            stale=self.stale_relation(snapshot, view),
        )

    def covered_relation(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """``view``'s covered intervals as a small in-memory table (interval_start,
        interval_end), once per version of ``batch/coverage``."""
        table = snapshot[BATCH_COVERAGE]

        def create(name: str) -> str:
            covered = f"covered_{name}_{view_suffix(view.key)}"
            coverage = self.coverage(snapshot, view)
            self.relations.create_table(covered, coverage.to_arrow(), owner=table)
            return covered

        return self.relations.derived(table, f"covered:{view.key}", create)

    def stale_relation(self, snap: LakeSnapshot, view: Definition | None = None) -> str:
        """The snapshot's uncounted arrivals (:func:`lake.coverage.staleness.stale_sql`) for
        ``view`` as a small in-memory table, computed once per version of master/arrivals and
        batch/coverage."""
        view = view or self.definition(snap)
        return self._arrivals_relation(
            snap, view, "stale", partial(stale_sql, attribution=view.attribution)
        )

    def marks_relation(self, snap: LakeSnapshot, view: Definition) -> str | None:
        """For a version with click attribution, the covered rows that late events in other
        minutes may change (:func:`lake.coverage.staleness.stale_marks_sql`) as a small
        in-memory table, computed once per version of master/arrivals, batch/coverage and the
        batch table; None without attribution. Each mark carries its row's dimensions, so a
        query's filters and scope narrow the marks as they narrow the rows."""
        if view.attribution is None:
            return None
        return self._arrivals_relation(
            snap, view, "marks", partial(stale_marks_sql, attribution=view.attribution)
        )

    def latest_speed_bucket(self, snapshot: LakeSnapshot) -> dt.datetime | None:
        """The newest bucket in the snapshot's speed/ctr."""
        table = snapshot[SPEED_CTR]
        value = self.relations.derived(
            table,
            "latest",
            lambda name: self.relations.scalar(f"SELECT max(bucket_start) FROM {name}"),
        )
        return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else None

    def _staleness_inputs(self, snap: LakeSnapshot, view: Definition) -> tuple[str, str, str]:
        """The relations a rule of :mod:`lake.coverage.staleness` reads for ``view``: the
        arrivals it counts, batch/coverage, and its batch table."""
        return (
            self.version_sides.filtered(snap[MASTER_ARRIVALS], view),
            self.relations.relation(snap[BATCH_COVERAGE]).name,
            self.relations.relation(snap[batch_table(view)]).name,
        )

    def _arrivals_relation(
        self, snap: LakeSnapshot, view: Definition, kind: str, select: Callable[..., str]
    ) -> str:
        """``select`` (a rule of :mod:`lake.coverage.staleness` over the arrivals ``view`` counts,
        batch/coverage and the version's batch rows) as an in-memory table named after
        ``kind``, computed once per version of the three tables."""
        arrivals, coverage = snap[MASTER_ARRIVALS], snap[BATCH_COVERAGE]
        batch = snap[batch_table(view)]
        source, coverage_name, batch_name = self._staleness_inputs(snap, view)

        def create(name: str) -> str:
            table = f"{kind}_{name}_{coverage_name}_{batch_name}"
            sql = select(arrivals=source, coverage=coverage_name, batch=batch_name, view=view.key)
            self.relations.create_table(table, sql, owner=arrivals)
            return table

        return self.relations.derived(
            arrivals, f"{kind}:{view.key}@{coverage.version}:{batch.version}", create
        )


def _interrupt_until_done(
    cur: duckdb.DuckDBPyConnection, timeout_s: float, done: threading.Event
) -> None:
    """At ``timeout_s``, interrupt ``cur``'s query, and again every 50 ms until it is done: an
    interrupt before the query starts (a busy machine can be that slow) is lost, and a single
    one would let the query run unbounded."""
    if done.wait(timeout_s):
        return
    while True:
        cur.interrupt()
        if done.wait(0.05):
            return
