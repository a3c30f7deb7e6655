"""Coverage's model (intervals, gaps, what one coverage holds and another does not, input
versions per minute) and its one reader of batch/coverage, on a real Delta table."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from deltalake import write_deltalake

from lake.catalog import BATCH_COVERAGE
from lake.coverage.log import read_runs
from lake.coverage.model import Coverage, CoverageRun, CoverageRuns
from lake.settings import LakeSettings

T = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)


def hours(n: float) -> dt.datetime:
    return T + dt.timedelta(hours=n)


def run(n: int, start: float, end: float, version: int, view: str = "ctr") -> CoverageRun:
    return CoverageRun(f"r{n}", view, hours(start), hours(end), version, 10 * n, hours(end))


def test_gaps_minus_and_holds() -> None:
    covered = Coverage([(hours(0), hours(1)), (hours(2), hours(3))])
    assert covered.gaps(hours(0.5), hours(4)) == [(hours(1), hours(2)), (hours(3), hours(4))]
    assert covered.gaps(hours(2), hours(3)) == []
    assert covered.holds(hours(0.25), hours(0.75))
    assert not covered.holds(hours(0.5), hours(2.5))
    history = Coverage([(hours(0), hours(4))])
    assert [(i.start, i.end) for i in history.minus(covered).intervals] == [
        (hours(1), hours(2)),
        (hours(3), hours(4)),
    ]
    assert history.minus(history).intervals == ()
    assert Coverage(()).minus(covered).intervals == ()


def test_runs_merge_per_version_and_give_each_minutes_newest_input_version() -> None:
    runs = CoverageRuns(
        [run(1, 0, 1, 5), run(2, 0.5, 1.5, 7), run(3, 0, 1, 9, view="ctr@v2"), run(2, 0.5, 1.5, 7)]
    )
    assert [(i.start, i.end) for i in runs.of("ctr").intervals] == [(hours(0), hours(1.5))]
    assert [(i.start, i.end) for i in runs.of("ctr@v2").intervals] == [(hours(0), hours(1))]
    assert runs.run_count("ctr") == 2  # a run recorded twice (a retry) counts once
    minute = dt.timedelta(minutes=1)
    versions = runs.input_versions("ctr", hours(0.5) - 2 * minute, hours(0.5) + 2 * minute)
    assert versions == [5, 5, 7, 7]
    assert runs.input_versions("ctr", hours(1.5), hours(1.5) + minute) == [None]


def test_the_log_reads_every_run_with_utc_times(lake: LakeSettings) -> None:
    assert read_runs(lake).runs == ()
    rows = [run(1, 2, 3, 4), run(2, 0, 1, 4), run(3, 0.5, 1.5, 6), run(4, 4, 5, 6)]
    table = pa.Table.from_pylist(
        [{name: getattr(r, name) for name in BATCH_COVERAGE.schema.names} for r in rows],
        schema=BATCH_COVERAGE.schema,
    )
    write_deltalake(BATCH_COVERAGE.path(lake), table)
    runs = read_runs(lake)
    assert sorted(runs.runs, key=lambda r: r.run_id) == rows
    assert [(i.start, i.end) for i in runs.of("ctr").intervals] == [
        (hours(0), hours(1.5)),
        (hours(2), hours(3)),
        (hours(4), hours(5)),
    ]
    assert all(r.interval_start.tzinfo == dt.UTC for r in runs.runs)
