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
)
from lake.coverage.model import Source, source_of
from runtime.times import from_micros
from serving_layer.ctr_sql import (
    MAX_PREDICATE_INTERVALS,
    ctr_sql,
)
from serving_layer.freshness import Freshness
from serving_layer.query import CtrQuery
from serving_layer.reach import NOT_MEASURED, Reach, ReachFound, reach_of
from serving_layer.reach_planner import ReachPlanner
from serving_layer.reader import SnapshotReader
from serving_layer.snapshots import LakeSnapshot
from serving_layer.wilson import wilson_interval
from views.definitions import Definition


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

    def __init__(self, reader: SnapshotReader, *, reach_max_values: int = 2_000_000) -> None:
        self.reader = reader
        # Where reach reads who a query's rows reached (the cube, hour rows, minute rows).
        self.planner = ReachPlanner(reader, reach_max_values=reach_max_values)

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
            intervals=self.planner.covered_within(query, snapshot, view),
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
        plan = self.planner.plan(query, snapshot, view, exact)
        sketched, counted, sketch_count = plan.statements
        if sketch_count is not None:  # refused before the sketches are brought in
            _, [(sketches_read,)] = self.reader.fetch_all(*sketch_count)
            self.planner.bounded(int(sketches_read or 0))
        keys = ["bucket_us", *query.group_by]
        counts: dict[tuple[object, ...], tuple[Any, ...]] = {}
        if counted is not None:
            counts = dict(_keyed(*self.reader.fetch_all(*counted), keys, _COUNTED))
        if plan.by_bitmaps:
            counts.update(self.planner.bitmap_counts(query, plan.hours, plan.by_bitmaps))
        if plan.by_cube and plan.dimension is not None:
            counts.update(self.planner.cube_counts(query, plan.cube, plan.dimension, plan.by_cube))
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
            clicks_window=view.attribution or dt.timedelta(0),
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
