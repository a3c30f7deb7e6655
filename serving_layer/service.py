"""The serving layer's answer: CTR rows by the merge rule (batch rows where the batch layer
covers a bucket, speed rows elsewhere) with provenance and Wilson intervals, and how fresh they
are, over one snapshot (:class:`~serving_layer.reader.SnapshotReader`). What each view holds
(versions, runs, drift, stale buckets) is :mod:`serving_layer.inventory`'s; the SQL sandbox is
:mod:`serving_layer.sandbox.database`'s.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from lake.catalog import BATCH_COVERAGE, MASTER_ARRIVALS, SPEED_CTR, VIEW_REGISTRY, batch_table
from lake.coverage.model import Source, source_of
from runtime.times import from_micros
from serving_layer.ctr_sql import MAX_PREDICATE_INTERVALS, ctr_sql, reach_sql
from serving_layer.freshness import Freshness
from serving_layer.query import CtrQuery
from serving_layer.reach import NOT_MEASURED, Reach, reach_of
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


class ServingLayer(SnapshotReader):
    """CTR answers over the lake; thread-safe, one instance per process."""

    def ctr_statement(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> tuple[str, dict[str, object]]:
        """The SQL and bound parameters that answer ``query`` for ``view`` over ``snapshot``
        (:func:`serving_layer.ctr_sql.ctr_sql` over the snapshot's relations)."""
        return ctr_sql(
            query,
            **self.sides(snapshot, view),
            covered=self.covered_relation(snapshot, view),
            stale=self.stale_relation(snapshot, view),
            intervals=self._covered_within(query, snapshot, view),
            marks=self.marks_relation(snapshot, view),
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
        fetched = self.fetch_all(sql, params)
        truncated = len(fetched) > query.limit
        groups = query.group_by
        reached = self.reach(query, snap, view) if query.reach else None
        # Grouped answers repeat each bucket once per group: its start and coverage once.
        buckets: dict[int, tuple[dt.datetime, float]] = {}
        rows = []
        for record in fetched[: query.limit]:
            bucket_us = record[0]
            if bucket_us not in buckets:
                start = from_micros(bucket_us)
                buckets[bucket_us] = (start, coverage.fraction(*query.bucket(start)))
            bucket, fraction = buckets[bucket_us]
            impressions, clicks, raw_clicks, orphans, repeats, ctr, stale_events, run_ids = record[
                -8:
            ]
            interval = wilson_interval(clicks, impressions)
            source = source_of(fraction)
            if stale_events and source == "batch":
                source = "stale"
            reach = NOT_MEASURED
            if reached is not None:
                key = tuple(record[: 1 + len(groups)])
                reach = reach_of(reached.get(key), source, impressions, int(stale_events or 0))
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
                    reach=reach,
                )
            )
        return CtrResult(query, rows, truncated, self.freshness(snap, view), view)

    def reach(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> dict[tuple[object, ...], tuple[object, ...]]:
        """Who ``query``'s rows reached (:func:`serving_layer.ctr_sql.reach_sql`), by
        (bucket_us, *group values): (users, clickers, listed, reach_sketches,
        clicker_sketches, unsketched)."""
        batch = self.reach_relation(snapshot[batch_table(view)], None)
        speed = self.reach_relation(snapshot[SPEED_CTR], view.where)
        sketched, counted, params = reach_sql(
            query,
            batch=batch,
            speed=speed,
            covered=self.covered_relation(snapshot, view),
            intervals=self._covered_within(query, snapshot, view),
        )
        width = 1 + len(query.group_by)
        counts = {tuple(r[:width]): r[width:] for r in self.fetch_all(counted, params)}
        return {
            tuple(r[:width]): (*counts.get(tuple(r[:width]), (0, 0)), *r[width:])
            for r in self.fetch_all(sketched, params)
        }

    def _covered_within(
        self, query: CtrQuery, snapshot: LakeSnapshot, view: Definition
    ) -> list[tuple[dt.datetime, dt.datetime]] | None:
        """The covered intervals in ``query``'s range as a range predicate's bounds, or None
        when there are too many (the merge rule then joins the covered table)."""
        within = self.coverage(snapshot, view).within(query.start, query.end)
        return within if len(within) <= MAX_PREDICATE_INTERVALS else None

    def freshness(
        self, snapshot: LakeSnapshot | None = None, view: Definition | None = None
    ) -> Freshness:
        snap = snapshot or self.snapshot()
        view = view or self.definition(snap)
        status = snap.status
        return Freshness(
            latest_covered_bucket=self.coverage(snap, view).latest_bucket,
            latest_speed_bucket=self.latest_speed_bucket(snap),
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
