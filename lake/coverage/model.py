"""Which minute buckets the batch layer has made exact: the runs ``batch/coverage`` records
and their union as disjoint intervals, the coverage rule of the serving layer ("covered → batch
rows, else speed rows") in one place. Pure values: :mod:`lake.coverage.log` reads and writes
the table.

``batch/coverage`` has one row per finished run (:class:`CoverageRun`); runs overlap (hourly
runs with a lookback, reruns, backfills). :class:`CoverageRuns` holds them for every view
version; their union per version, :class:`Coverage` (sorted disjoint [start, end) intervals),
answers "is this bucket covered" with one comparison, tells a rolled-up bucket how much of it
is exact, and gives the gaps a run or a build still has to fill (:meth:`Coverage.gaps`,
:meth:`Coverage.minus`). The serving layer's queries, its SQL sandbox, the pruning of superseded
speed rows, the batch job's drift and the builds of view versions all read it from here;
:func:`in_intervals_sql` is the SQL predicate's one spelling.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import pyarrow as pa

# batch: every minute exact; stale: every minute covered, some with arrivals no run counted yet
# (included, approximately); speed: no minute covered; mixed: some covered, some not.
Source = Literal["batch", "stale", "speed", "mixed"]
MINUTE: Final = dt.timedelta(minutes=1)


@dataclass(frozen=True, order=True)
class CoveredInterval:
    start: dt.datetime
    end: dt.datetime


class Coverage:
    """The union of covered intervals; the empty coverage covers nothing."""

    def __init__(self, intervals: Iterable[tuple[dt.datetime, dt.datetime]]) -> None:
        merged: list[CoveredInterval] = []
        for start, end in sorted(i for i in intervals if i[0] < i[1]):
            if merged and start <= merged[-1].end:
                if end > merged[-1].end:
                    merged[-1] = CoveredInterval(merged[-1].start, end)
            else:
                merged.append(CoveredInterval(start, end))
        self.intervals: Sequence[CoveredInterval] = tuple(merged)
        self._starts = [i.start for i in merged]

    @property
    def latest_bucket(self) -> dt.datetime | None:
        """Start of the last covered minute."""
        return self.intervals[-1].end - dt.timedelta(minutes=1) if self.intervals else None

    def covers(self, bucket: dt.datetime) -> bool:
        i = bisect.bisect_right(self._starts, bucket) - 1
        return i >= 0 and bucket < self.intervals[i].end

    def within(self, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
        """The covered parts of [start, end), in order."""
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        parts = []
        for interval in self.intervals[i:]:
            if interval.start >= end:
                break
            lo, hi = max(start, interval.start), min(end, interval.end)
            if lo < hi:
                parts.append((lo, hi))
        return parts

    def gaps(self, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
        """The parts of [start, end) not covered, in order."""
        gaps, cursor = [], start
        for lo, hi in self.within(start, end):
            if cursor < lo:
                gaps.append((cursor, lo))
            cursor = hi
        if cursor < end:
            gaps.append((cursor, end))
        return gaps

    def minus(self, other: Coverage) -> Coverage:
        """What this coverage holds and ``other`` does not."""
        return Coverage(gap for i in self.intervals for gap in other.gaps(i.start, i.end))

    def holds(self, start: dt.datetime, end: dt.datetime) -> bool:
        """Whether all of [start, end) is covered."""
        return not self.gaps(start, end)

    def covered_span(self, start: dt.datetime, end: dt.datetime) -> dt.timedelta:
        """How much of [start, end) is covered."""
        total = dt.timedelta(0)
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        for interval in self.intervals[i:]:
            if interval.start >= end:
                break
            overlap = min(end, interval.end) - max(start, interval.start)
            if overlap > dt.timedelta(0):
                total += overlap
        return total

    def to_arrow(self) -> pa.Table:
        """The intervals as a table (``interval_start``, ``interval_end``) to join against."""
        ts = pa.timestamp("us", tz="UTC")
        return pa.table(
            {
                "interval_start": pa.array([i.start for i in self.intervals], ts),
                "interval_end": pa.array([i.end for i in self.intervals], ts),
            }
        )

    def sql_predicate(self, column: str) -> str:
        """SQL, true when ``column`` (a timestamp) is covered; timestamp literals only."""
        return in_intervals_sql(
            column,
            [
                (f"TIMESTAMP '{_sql_time(i.start)}'", f"TIMESTAMP '{_sql_time(i.end)}'")
                for i in self.intervals
            ],
        )

    def fraction(self, start: dt.datetime, end: dt.datetime) -> float:
        """The covered share of [start, end), from 0 to 1 (0 for an empty interval)."""
        if end <= start:
            return 0.0
        return min(self.covered_span(start, end) / (end - start), 1.0)

    def source(self, start: dt.datetime, end: dt.datetime) -> Source:
        """``batch`` if [start, end) is all covered, ``speed`` if none of it, else ``mixed``."""
        return source_of(self.fraction(start, end))


@dataclass(frozen=True)
class CoverageRun:
    """One row of ``batch/coverage``: a finished run of a view version (``view``: its key,
    ``ctr`` or ``ctr@v2``) made [interval_start, interval_end) exact from master/events at
    ``input_version``."""

    run_id: str
    view: str
    interval_start: dt.datetime
    interval_end: dt.datetime
    input_version: int
    rows_written: int = 0
    finished_at: dt.datetime | None = None


class CoverageRuns:
    """The runs of ``batch/coverage`` (every view version's), as read once."""

    def __init__(self, runs: Iterable[CoverageRun]) -> None:
        self.runs: Sequence[CoverageRun] = tuple(runs)
        self._merged: dict[str, Coverage] = {}

    def of(self, view: str) -> Coverage:
        """The merged covered intervals of ``view`` (a version's key: ``ctr``, ``ctr@v2``)."""
        if view not in self._merged:
            self._merged[view] = Coverage(
                (r.interval_start, r.interval_end) for r in self.runs if r.view == view
            )
        return self._merged[view]

    def run_count(self, view: str) -> int:
        """The distinct runs recorded for ``view``."""
        return len({r.run_id for r in self.runs if r.view == view})

    def input_versions(self, view: str, start: dt.datetime, end: dt.datetime) -> list[int | None]:
        """Per minute of [start, end): the newest master/events version a run of ``view``
        covering it read (None: no run covers it)."""
        versions: list[int | None] = [None] * ((end - start) // MINUTE)
        for run in self.runs:
            if run.view != view:
                continue
            lo = max(0, -(-(run.interval_start - start) // MINUTE))
            hi = min(len(versions), -(-(run.interval_end - start) // MINUTE))
            for i in range(lo, hi):
                current = versions[i]
                versions[i] = (
                    run.input_version if current is None else max(current, run.input_version)
                )
        return versions


def source_of(covered_fraction: float) -> Source:
    """The source of a bucket whose ``covered_fraction`` (0 to 1) is covered, stale aside."""
    if covered_fraction >= 1:
        return "batch"
    return "speed" if covered_fraction <= 0 else "mixed"


def in_intervals_sql(column: str, bounds: Sequence[tuple[str, str]]) -> str:
    """SQL, true when ``column`` lies in one of the [start, end) ``bounds`` (SQL expressions:
    literals or bound-parameter placeholders, never request text); ``false`` for none."""
    if not bounds:
        return "false"
    return "(" + " OR ".join(f"({column} >= {lo} AND {column} < {hi})" for lo, hi in bounds) + ")"


def delta_rs_timestamp(value: dt.datetime) -> str:
    """A timestamp literal delta-rs (DataFusion) compares with a UTC timestamp column: a string
    in UTC (a typed ``TIMESTAMP '…'`` literal has no time zone there, and the comparison is
    refused)."""
    return "'" + value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") + "'"


def _sql_time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00:00")
