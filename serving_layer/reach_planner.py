"""Where the serving layer reads who a query's rows reached: the reach cube for a query of one
dimension or none (:mod:`batch_layer.reach_cube`), the hour rows' bitmaps for the others while
there are few enough of them (:mod:`batch_layer.hours`), the minute rows' lists (counted in
DuckDB) and sketches for the rest, and a bound on the sketches and bitmaps one answer may bring
into the process."""

from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, NamedTuple

from lake.catalog import SPEED_CTR, Table, batch_table, hours_table, reach_cube_table
from runtime.times import from_micros
from serving_layer.ctr_sql import (
    MAX_PREDICATE_INTERVALS,
    ReachStatements,
    bitmap_rows_sql,
    bitmap_sql,
    cube_dimension,
    cube_sql,
    hour_check_sql,
    reach_sql,
)
from serving_layer.hour_rows import candidate_hours, hours_of, joined, subtract
from serving_layer.query import CtrQuery
from serving_layer.reader import QueryLimitError, SnapshotReader
from serving_layer.snapshots import LakeSnapshot
from views import bitmaps
from views.definitions import Definition


class ReachLimitError(QueryLimitError):
    """An answer's reach would bring more sketches and bitmaps into the process than the limit
    (a 400, remembered as the other limits' refusals are)."""


class ReachPlan(NamedTuple):
    """How :meth:`ServingLayer.reach` answers a query (:meth:`ReachPlanner.plan`)."""

    statements: ReachStatements
    hours: str  # the relation of the view's hour rows
    used: list[tuple[dt.datetime, dt.datetime]]  # the hours whose hour rows stand in
    by_bitmaps: list[tuple[dt.datetime, dt.datetime]]  # the buckets counted from hour rows
    cube: str = ""  # the relation of the view's reach cube
    dimension: str | None = None  # the cube's dimension that answers the query
    by_cube: list[tuple[dt.datetime, dt.datetime]] = []  # noqa: RUF012 - a NamedTuple's default


# At most this many hour rows' bitmaps are brought into the process for one answer; above it
# (a range of hours at a cardinality where every few events make a combination of their own)
# their minutes' lists are counted in DuckDB instead (bench reach, the realistic lake: a day's
# 2.4 M hour rows took 9 s in Python).
MAX_BITMAP_ROWS: Final = 100_000
# Hour checks remembered (a few per range the dashboards ask and table checked).
_CHECKS_KEPT: Final = 256


class ReachPlanner:
    """How :meth:`serving_layer.service.ServingLayer.reach` reads a query's users; thread-safe,
    one per serving layer."""

    def __init__(self, reader: SnapshotReader, *, reach_max_values: int = 2_000_000) -> None:
        self.reader = reader
        # At most this many sketches and bitmaps are brought into the process for one
        # answer's reach (API_CTR_REACH_MAX_VALUES); past it the answer is refused.
        self.reach_max_values = reach_max_values
        # The hours whose hour rows (or cube rows) may not stand in, by the versions of the
        # minute rows and of those rows and the hours checked: a check scans the minute rows'
        # run ids (150 ms for a day at real cardinality), and its answer holds until either
        # table has a new commit (a batch run: about once an hour).
        self._invalid_hours: OrderedDict[tuple[object, ...], frozenset[dt.datetime]] = OrderedDict()
        self._invalid_lock = threading.Lock()

    def plan(
        self,
        query: CtrQuery,
        snapshot: LakeSnapshot,
        view: Definition,
        exact: Sequence[tuple[dt.datetime, dt.datetime]] | None,
    ) -> ReachPlan:
        """How :meth:`reach` answers ``query``: the buckets counted from the reach cube (a
        query of one dimension or none: :func:`serving_layer.ctr_sql.cube_dimension`), those
        counted from the hour rows' bitmaps (when there are at most :data:`MAX_BITMAP_ROWS`),
        the hours whose hour rows stand in for their minutes, and the SELECTs of the rest."""
        sides = self.reader.version_sides
        hours = self.reader.relation_name(snapshot[hours_table(view)])
        cube = self.reader.relation_name(snapshot[reach_cube_table(view)])
        dimension = cube_dimension(query)
        by_cube: list[tuple[dt.datetime, dt.datetime]] = []
        if dimension is not None and exact is not None:
            in_cube = self.hours_used(query, snapshot, view, reach_cube_table(view))
            by_cube = query.whole_buckets(in_cube) if in_cube else []
        rest = subtract(exact, by_cube) if exact is not None else None
        # The hour rows stand in for the exact buckets the cube does not count, and give the
        # estimated buckets their hours' sketches (a mixed day's total: 6,600 hour sketches
        # instead of 864,000 minute ones); none to read when the cube counts the whole range.
        whole = by_cube == [(query.start, query.end)]
        used = [] if whole else self.hours_used(query, snapshot, view)
        by_bitmaps: list[tuple[dt.datetime, dt.datetime]] = []
        if used and rest:
            candidates = subtract(query.whole_buckets(used), by_cube)
            if candidates and self._bitmap_rows(query, hours, candidates) <= MAX_BITMAP_ROWS:
                by_bitmaps = candidates
        statements = reach_sql(
            query,
            batch=sides.reach(snapshot[batch_table(view)], None),
            speed=sides.reach(snapshot[SPEED_CTR], view.where),
            covered=self.reader.covered_relation(snapshot, view),
            intervals=self.covered_within(query, snapshot, view),
            exact=exact,
            counted=subtract(rest, by_bitmaps) if rest is not None else None,
            hours=(hours, used) if used else None,
        )
        return ReachPlan(statements, hours, used, by_bitmaps, cube, dimension, by_cube)

    def hours_used(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition, table: Table | None = None
    ) -> list[tuple[dt.datetime, dt.datetime]]:
        """The whole covered hours of ``query``'s range whose rows of ``table`` (the view's
        hour rows, or its reach cube) stand in for their minute rows
        (:mod:`serving_layer.hour_rows`), adjacent ones joined; none when there would be more
        parts than a range predicate takes."""
        covered = self.reader.coverage(snapshot, view).within(query.start, query.end)
        candidates = candidate_hours(query, covered)
        if not candidates:
            return []
        invalid = self._invalid(snapshot, view, table or hours_table(view), candidates)
        used = joined(h for h in hours_of(candidates) if h not in invalid)
        return used if len(used) <= MAX_PREDICATE_INTERVALS else []

    def _invalid(
        self,
        snapshot: LakeSnapshot,
        view: Definition,
        table: Table,
        candidates: Sequence[tuple[dt.datetime, dt.datetime]],
    ) -> frozenset[dt.datetime]:
        """The hours of ``candidates`` whose rows of ``table`` may not stand in for their
        minute rows (:func:`serving_layer.ctr_sql.hour_check_sql`), remembered by versions."""
        batch = snapshot[batch_table(view)]
        rows = snapshot[table]
        start, end = candidates[0][0], candidates[-1][1]
        key = (batch.name, batch.version, rows.name, rows.version, start, end)
        with self._invalid_lock:
            if key in self._invalid_hours:
                self._invalid_hours.move_to_end(key)
                return self._invalid_hours[key]
        sql, params = hour_check_sql(
            batch=self.reader.relation_name(batch),
            hours=self.reader.relation_name(rows),
            start=start,
            end=end,
        )
        invalid = frozenset(from_micros(r[0]) for r in self.reader.fetch_all(sql, params)[1])
        with self._invalid_lock:
            self._invalid_hours[key] = invalid
            while len(self._invalid_hours) > _CHECKS_KEPT:
                self._invalid_hours.popitem(last=False)
        return invalid

    def bounded(self, values: int) -> None:
        """Refuse an answer whose reach brought ``values`` sketches or bitmaps into the
        process, more than :attr:`reach_max_values`."""
        if values > self.reach_max_values:
            raise ReachLimitError(
                f"reach needs {values:,} sketches and bitmaps, over API_CTR_REACH_MAX_VALUES "
                f"({self.reach_max_values:,}): ask without reach (reach=false), or for a "
                "shorter range, coarser buckets or fewer group_by dimensions"
            )

    def _bitmap_rows(
        self, query: CtrQuery, hours: str, parts: Sequence[tuple[dt.datetime, dt.datetime]]
    ) -> int:
        """How many hour rows :meth:`bitmap_counts` would bring into the process."""
        _, [(rows,)] = self.reader.fetch_all(*bitmap_rows_sql(query, hours=hours, parts=parts))
        return int(rows)

    def bitmap_counts(
        self, query: CtrQuery, hours: str, parts: Sequence[tuple[dt.datetime, dt.datetime]]
    ) -> dict[tuple[object, ...], tuple[int, int, bool]]:
        """The exact (users, clickers, listed) per key of the buckets in ``parts``: the sizes
        of the unions of their hour rows' bitmaps (:func:`views.bitmaps.union_size`)."""
        return self._unions(query, *bitmap_sql(query, hours=hours, parts=parts))

    def cube_counts(
        self,
        query: CtrQuery,
        cube: str,
        dimension: str,
        parts: Sequence[tuple[dt.datetime, dt.datetime]],
    ) -> dict[tuple[object, ...], tuple[int, int, bool]]:
        """The exact (users, clickers, listed) per key of the buckets in ``parts``: the sizes
        of the unions of their reach cube rows' bitmaps (a few hundred rows a day)."""
        sql, params = cube_sql(query, cube=cube, dimension=dimension, parts=parts)
        return self._unions(query, sql, params)

    def _unions(
        self, query: CtrQuery, sql: str, params: dict[str, object]
    ) -> dict[tuple[object, ...], tuple[int, int, bool]]:
        """The sizes of the unions per key of the bitmaps ``sql`` selects (the key, then the
        users' and the clickers' bitmaps)."""
        _, rows = self.reader.fetch_all(sql, params)
        self.bounded(2 * len(rows))
        width = 1 + len(query.group_by)
        grouped: dict[tuple[object, ...], tuple[list[bytes], list[bytes]]] = {}
        for row in rows:
            seen, clicked = grouped.setdefault(tuple(row[:width]), ([], []))
            seen.append(row[width])
            clicked.append(row[width + 1])
        return {
            key: (bitmaps.union_size(seen), bitmaps.union_size(clicked), True)
            for key, (seen, clicked) in grouped.items()
        }

    def covered_within(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> list[tuple[dt.datetime, dt.datetime]] | None:
        """The covered intervals in ``query``'s range as a range predicate's bounds, or None
        when there are too many (the merge rule then joins the covered table)."""
        within = self.reader.coverage(snapshot, view).within(query.start, query.end)
        return within if len(within) <= MAX_PREDICATE_INTERVALS else None
