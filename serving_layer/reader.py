"""Reading one consistent snapshot of the lake for a view version: what both the CTR answers
(:mod:`serving_layer.service`) and the inventory (:mod:`serving_layer.inventory`) read.

Each request pins a :class:`~serving_layer.snapshots.LakeSnapshot` and queries that snapshot's
relations (:class:`~serving_layer.relations.RelationCache`: one DuckDB relation per table
version) through a cursor of its own, so concurrent requests never block each other and never
see a half-written table. On top of the tables' own relations, this builds once per table
version what every reader of a view version needs: its registry and coverage, its batch and
speed sides with the five counts, its covered intervals and its stale arrivals.
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
from serving_layer.merge_rule import merged_sql, side_rows_sql
from serving_layer.relations import RelationCache
from serving_layer.snapshots import LakeSnapshot, SnapshotSource, TableSnapshot
from views.columns import DIMENSIONS, MEASURES, SKETCHES, USER_LISTS
from views.definitions import Definition, definition


class QueryLimitError(RuntimeError):
    """A query was stopped at a resource limit (time or memory): ask for less."""


class SnapshotReader:
    """A view version's relations over lake snapshots; thread-safe, one instance per process."""

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

    def fetch_all(self, sql: str, params: dict[str, object]) -> list[tuple[Any, ...]]:
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
        """The ``batch`` and ``speed`` relations :func:`serving_layer.ctr_sql.ctr_sql` reads for
        ``view`` (default: the published version): its tables' rows with the five counts of
        :data:`views.columns.MEASURES` (a table's own relation lacks some)."""
        view = view or self.definition(snapshot)
        return {
            "batch": self._batch_relation(snapshot, view),
            "speed": self._speed_relation(snapshot[SPEED_CTR], view),
        }

    def merged_relation(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """The merge rule of ``view`` at minute grain over the snapshot, as a SELECT (columns
        of :func:`serving_layer.merge_rule.merged_sql`)."""
        return merged_sql(
            batch=self._batch_relation(snapshot, view),
            speed=self._speed_relation(snapshot[SPEED_CTR], view, per_key=True),
            covered=self.covered_relation(snapshot, view),
            stale=self.stale_relation(snapshot, view),
        )

    def covered_relation(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """``view``'s covered intervals as a small in-memory table (interval_start,
        interval_end), once per version of ``batch/coverage``."""
        table = snapshot[BATCH_COVERAGE]

        def create(name: str) -> str:
            covered = f"covered_{name}_{_suffix(view.key)}"
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
        table = snapshot[batch_table(view)]
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
        (:func:`serving_layer.merge_rule.side_rows_sql`): a relation name or a parenthesized SELECT.

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

    def reach_relation(self, table: TableSnapshot, where: str | None) -> str:
        """``table``'s rows as :func:`serving_layer.ctr_sql.reach_sql` reads them: the key, the
        counts, :data:`views.columns.USER_LISTS` and :data:`views.columns.SKETCHES` (null
        where the table has not got them: written before reach was measured), narrowed by
        ``where`` (a version's trusted predicate)."""
        base = self.relations.relation(table).name
        columns = self._columns(table)
        types = {
            **dict.fromkeys(USER_LISTS, "VARCHAR[]"),
            **dict.fromkeys(SKETCHES, "BLOB"),
            "run_id": "VARCHAR",  # batch rows'
        }
        reach = ", ".join(
            name if name in columns else f"NULL::{kind} AS {name}" for name, kind in types.items()
        )
        narrow = f" WHERE {where}" if where else ""
        key = ", ".join(["bucket_start", *DIMENSIONS])
        return f"(SELECT {key}, impressions, clicks, {reach} FROM {base}{narrow})"

    def _staleness_inputs(self, snap: LakeSnapshot, view: Definition) -> tuple[str, str, str]:
        """The relations a rule of :mod:`lake.coverage.staleness` reads for ``view``: the
        arrivals it counts, batch/coverage, and its batch table."""
        return (
            self._filtered(snap[MASTER_ARRIVALS], view),
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


def _suffix(key: str) -> str:
    """A view key as part of a DuckDB name: ``ctr@v2`` -> ``ctr_v2``."""
    return key.replace("@", "_")
