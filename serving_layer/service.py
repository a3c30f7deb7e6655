"""The serving layer's answer: CTR rows by the merge rule (batch rows where the batch layer
covers a bucket, speed rows elsewhere) with provenance and Wilson intervals, and how fresh they
are, over one snapshot read through a :class:`~serving_layer.reader.SnapshotReader`: the
query's SQL (:mod:`serving_layer.ctr_sql`) over the reader's relations, its rows read back by
column name. What each view holds (versions, runs, drift, stale buckets) is
:mod:`serving_layer.inventory`'s; the SQL sandbox is :mod:`serving_layer.sandbox.database`'s.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from lake.catalog import (
    BATCH_COVERAGE,
    MASTER_ARRIVALS,
    SPEED_CTR,
    VIEW_REGISTRY,
    batch_table,
    hours_table,
)
from lake.coverage.model import Source, source_of
from runtime.times import from_micros
from serving_layer.ctr_sql import (
    MAX_PREDICATE_INTERVALS,
    ReachStatements,
    bitmap_sql,
    ctr_sql,
    hour_check_sql,
    reach_sql,
)
from serving_layer.freshness import Freshness
from serving_layer.hour_rows import candidate_hours, hours_of, joined, subtract
from serving_layer.query import CtrQuery
from serving_layer.reach import NOT_MEASURED, Reach, ReachFound, reach_of
from serving_layer.reader import SnapshotReader
from serving_layer.snapshots import LakeSnapshot
from serving_layer.wilson import wilson_interval
from views import bitmaps
from views.definitions import Definition


class ReachPlan(NamedTuple):
    """How :meth:`ServingLayer.reach` answers a query (:meth:`ServingLayer.reach_plan`)."""

    statements: ReachStatements
    hours: str  # the relation of the view's hour rows
    used: list[tuple[dt.datetime, dt.datetime]]  # the hours whose hour rows stand in
    by_bitmaps: list[tuple[dt.datetime, dt.datetime]]  # the buckets counted from bitmaps


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
    reach: Reach = NOT_MEASURED  # distinct users (serving_layer.reach)


@dataclass(frozen=True)
class CtrResult:
    query: CtrQuery
    rows: list[CtrRow]
    truncated: bool
    freshness: Freshness
    view: Definition


class CtrRecord(NamedTuple):
    """A row of :func:`~serving_layer.ctr_sql.ctr_sql` as DuckDB answers it, by column name."""

    bucket_us: int  # bucket start, microseconds since the epoch
    groups: tuple[str | None, ...]  # the query's group_by values, in its order
    impressions: int
    clicks: int
    raw_clicks: int
    orphan_clicks: int | None
    repeat_clicks: int | None
    ctr: float | None
    stale_events: int | None
    run_ids: list[str] | None

    @property
    def key(self) -> tuple[object, ...]:
        """The row's bucket and group, as :func:`~serving_layer.ctr_sql.reach_sql` keys it."""
        return (self.bucket_us, *self.groups)


class ServingLayer:
    """CTR answers over the lake, read through ``reader`` (which it closes); thread-safe, one
    instance per process."""

    def __init__(self, reader: SnapshotReader) -> None:
        self.reader = reader

    def close(self) -> None:
        self.reader.close()

    def ctr_statement(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> tuple[str, dict[str, object]]:
        """The SQL and bound parameters that answer ``query`` for ``view`` over ``snapshot``
        (:func:`serving_layer.ctr_sql.ctr_sql` over the snapshot's relations)."""
        reader = self.reader
        return ctr_sql(
            query,
            **reader.sides(snapshot, view),
            covered=reader.covered_relation(snapshot, view),
            stale=reader.stale_relation(snapshot, view),
            intervals=self._covered_within(query, snapshot, view),
            marks=reader.marks_relation(snapshot, view),
        )

    def ctr(
        self, query: CtrQuery, snapshot: LakeSnapshot | None = None, version: int | None = None
    ) -> CtrResult:
        """Rows of ``query`` by the merge rule, with provenance and Wilson intervals, from the
        published version of the view (or ``version``)."""
        snap = snapshot or self.reader.snapshot()
        view = self.reader.definition(snap, version)
        coverage = self.reader.coverage(snap, view)
        columns, fetched = self.reader.fetch_all(*self.ctr_statement(query, snap, view))
        truncated = len(fetched) > query.limit
        reached = None
        if query.reach:
            whole = query.whole_buckets(coverage.within(query.start, query.end))
            exact = whole if len(whole) <= MAX_PREDICATE_INTERVALS else None
            reached = self.reach(query, snap, view, exact=exact)
        # Grouped answers repeat each bucket once per group: its start and coverage once.
        buckets: dict[int, tuple[dt.datetime, float]] = {}
        rows = []
        for record in _records(columns, fetched[: query.limit], query.group_by):
            if record.bucket_us not in buckets:
                start = from_micros(record.bucket_us)
                buckets[record.bucket_us] = (start, coverage.fraction(*query.bucket(start)))
            bucket, fraction = buckets[record.bucket_us]
            interval = wilson_interval(record.clicks, record.impressions)
            stale_events = int(record.stale_events or 0)
            source = source_of(fraction)
            if stale_events and source == "batch":
                source = "stale"
            reach = NOT_MEASURED
            if reached is not None:
                found = reached.get(record.key)
                reach = reach_of(found, source, record.impressions, stale_events)
            rows.append(
                CtrRow(
                    bucket_start=bucket,
                    dimensions=dict(zip(query.group_by, record.groups, strict=True)),
                    impressions=record.impressions,
                    clicks=record.clicks,
                    raw_clicks=record.raw_clicks,
                    orphan_clicks=record.orphan_clicks,
                    repeat_clicks=record.repeat_clicks,
                    ctr=record.ctr,
                    ctr_ci_low=interval[0] if interval else None,
                    ctr_ci_high=interval[1] if interval else None,
                    source=source,
                    covered_fraction=fraction,
                    stale_events=stale_events,
                    run_ids=tuple(record.run_ids or ()),
                    reach=reach,
                )
            )
        return CtrResult(query, rows, truncated, self.freshness(snap, view), view)

    def reach(
        self,
        query: CtrQuery,
        snapshot: LakeSnapshot,
        view: Definition,
        exact: Sequence[tuple[dt.datetime, dt.datetime]] | None = None,
    ) -> dict[tuple[object, ...], ReachFound]:
        """Who ``query``'s rows reached (:func:`serving_layer.ctr_sql.reach_sql`), by
        (bucket_us, *group values). ``exact``: the parts of the range whose buckets are wholly
        covered (:meth:`CtrQuery.whole_buckets`; their reach is the exact count: no sketch is read
        there, no user counted elsewhere). Where the batch layer's hour rows stand in for their
        minutes (:mod:`serving_layer.hour_rows`), a bucket made of such hours is counted from
        their bitmaps and an estimate unions their sketches."""
        plan = self.reach_plan(query, snapshot, view, exact)
        sketched, counted = plan.statements
        keys = ["bucket_us", *query.group_by]
        counts: dict[tuple[object, ...], tuple[Any, ...]] = {}
        if counted is not None:
            counts = dict(_keyed(*self.reader.fetch_all(*counted), keys, _COUNTED))
        if plan.by_bitmaps:
            counts.update(self.bitmap_counts(query, plan.hours, plan.by_bitmaps))
        found = {
            key: ReachFound(*counts.get(key, (0, 0))[:2], *values)
            for key, values in _keyed(*self.reader.fetch_all(*sketched), keys, _SKETCHED)
        }
        if exact is None:
            return found
        for key, (users, clickers, listed) in counts.items():
            if not listed:
                # A covered bucket with rows written before reach was measured: its answer
                # needs every row's sketch (or says it was not measured). Rare: once over.
                return self.reach(query, snapshot, view)
            found.setdefault(key, ReachFound(users, clickers, True, [], [], 0))
        return found

    def reach_plan(
        self,
        query: CtrQuery,
        snapshot: LakeSnapshot,
        view: Definition,
        exact: Sequence[tuple[dt.datetime, dt.datetime]] | None,
    ) -> ReachPlan:
        """How :meth:`reach` answers ``query``: the hours whose hour rows stand in for their
        minutes, the buckets counted from their bitmaps, and the SELECTs of the rest."""
        sides = self.reader.version_sides
        hours = self.reader.relation_name(snapshot[hours_table(view)])
        used = self.hours_used(query, snapshot, view)
        by_bitmaps = query.whole_buckets(used) if used and exact is not None else []
        statements = reach_sql(
            query,
            batch=sides.reach(snapshot[batch_table(view)], None),
            speed=sides.reach(snapshot[SPEED_CTR], view.where),
            covered=self.reader.covered_relation(snapshot, view),
            intervals=self._covered_within(query, snapshot, view),
            exact=exact,
            counted=subtract(exact, by_bitmaps) if exact is not None else None,
            hours=(hours, used) if used else None,
        )
        return ReachPlan(statements, hours, used, by_bitmaps)

    def hours_used(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> list[tuple[dt.datetime, dt.datetime]]:
        """The whole covered hours of ``query``'s range whose hour rows stand in for their
        minute rows (:mod:`serving_layer.hour_rows`), adjacent ones joined; none when there
        would be more parts than a range predicate takes."""
        covered = self.reader.coverage(snapshot, view).within(query.start, query.end)
        candidates = candidate_hours(query, covered)
        if not candidates:
            return []
        sql, params = hour_check_sql(
            batch=self.reader.relation_name(snapshot[batch_table(view)]),
            hours=self.reader.relation_name(snapshot[hours_table(view)]),
            start=candidates[0][0],
            end=candidates[-1][1],
        )
        invalid = {from_micros(r[0]) for r in self.reader.fetch_all(sql, params)[1]}
        used = joined(h for h in hours_of(candidates) if h not in invalid)
        return used if len(used) <= MAX_PREDICATE_INTERVALS else []

    def bitmap_counts(
        self, query: CtrQuery, hours: str, parts: Sequence[tuple[dt.datetime, dt.datetime]]
    ) -> dict[tuple[object, ...], tuple[int, int, bool]]:
        """The exact (users, clickers, listed) per key of the buckets in ``parts``: the sizes
        of the unions of their hour rows' bitmaps (:func:`views.bitmaps.union_size`)."""
        sql, params = bitmap_sql(query, hours=hours, parts=parts)
        _, rows = self.reader.fetch_all(sql, params)  # the key, then the two bitmaps
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

    def _covered_within(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> list[tuple[dt.datetime, dt.datetime]] | None:
        """The covered intervals in ``query``'s range as a range predicate's bounds, or None
        when there are too many (the merge rule then joins the covered table)."""
        within = self.reader.coverage(snapshot, view).within(query.start, query.end)
        return within if len(within) <= MAX_PREDICATE_INTERVALS else None

    def freshness(
        self, snapshot: LakeSnapshot | None = None, view: Definition | None = None
    ) -> Freshness:
        snap = snapshot or self.reader.snapshot()
        view = view or self.reader.definition(snap)
        status = snap.status
        return Freshness(
            latest_covered_bucket=self.reader.coverage(snap, view).latest_bucket,
            latest_speed_bucket=self.reader.latest_speed_bucket(snap),
            speed_updated_at=status.updated_at if status else None,
            speed_watermark=status.watermark if status else None,
            speed_lag_records=status.offsets_behind if status else None,
            settle=view.settle,
            versions={
                table.name: snap[table].version
                for table in (
                    batch_table(view),
                    BATCH_COVERAGE,
                    SPEED_CTR,
                    MASTER_ARRIVALS,
                    VIEW_REGISTRY,
                )
            },
        )


# The columns of reach_sql's two SELECTs besides the key, in ReachFound's order.
_COUNTED: Final = ReachFound._fields[:3]
_SKETCHED: Final = ReachFound._fields[2:]


def _records(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], group_by: Sequence[str]
) -> Iterator[CtrRecord]:
    """``rows`` of ctr_sql as records, their values found by column name."""
    at = {name: i for i, name in enumerate(columns)}
    bucket, groups = at["bucket_us"], [at[d] for d in group_by]
    measures = [at[name] for name in CtrRecord._fields[2:]]
    for row in rows:
        yield CtrRecord(row[bucket], tuple(row[i] for i in groups), *(row[i] for i in measures))


def _keyed(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    keys: Sequence[str],
    values: Sequence[str],
) -> Iterator[tuple[tuple[object, ...], tuple[Any, ...]]]:
    """(the ``keys`` columns' values, the ``values`` columns') of each row, by column name."""
    at = {name: i for i, name in enumerate(columns)}
    key_at, value_at = [at[k] for k in keys], [at[v] for v in values]
    for row in rows:
        yield tuple(row[i] for i in key_at), tuple(row[i] for i in value_at)
