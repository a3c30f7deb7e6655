"""Exactness that settles: the batch layer covers a minute only once on-time events can no longer
change it (the version's settle delay: its lateness, and its attribution window), so ordinary
clicks are counted before the minute is covered and only late events make it stale."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from batch_layer.interval import Interval, IntervalError
from lake.catalog import MASTER_EVENTS
from lake.coverage.staleness import read_stale
from lake.registry import read_registry, record
from lake.settings import LakeSettings
from tests.support.events import archive, event
from tests.support.lake_writer import ctr_row, write_arrivals
from tests.support.lakes import new_lake
from views.definitions import definition
from workflows.batch import recompute

H = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def test_a_version_settles_after_its_lateness_and_its_attribution_window() -> None:
    assert definition("ctr", 1).settle == dt.timedelta(minutes=10)
    assert definition("ctr", 3).settle == dt.timedelta(minutes=70)
    # The first minute not settled: whole minutes, seconds dropped.
    now = H + dt.timedelta(minutes=80, seconds=59)
    assert definition("ctr", 3).settled_before(now) == H + 10 * MINUTE
    assert definition("ctr", 1).settled_before(now) == H + 70 * MINUTE


def test_an_interval_before_a_moment() -> None:
    hour = Interval(H, H + 60 * MINUTE)
    assert hour.before(H + 90 * MINUTE) == hour
    assert hour.before(H + 20 * MINUTE) == Interval(H, H + 20 * MINUTE)
    assert hour.before(H) is None


def test_an_interval_error_names_the_flags_the_user_typed() -> None:
    with pytest.raises(IntervalError, match=r"^--from: '27/11/2026' is not an ISO-8601 time"):
        Interval.parse("27/11/2026", "2026-11-28", names=("--from", "--to"))
    with pytest.raises(IntervalError, match=r"^--to \(.*\) must be after --from"):
        Interval.parse("2026-11-28", "2026-11-27", names=("--from", "--to"))


def _arrive(spark: SparkSession, lake: LakeSettings, row: dict[str, object]) -> None:
    """``row`` archived as the archiver does: into master/events, and its count into
    master/arrivals with the events version that holds it."""
    archive(spark, lake, [row])
    version = DeltaTable(MASTER_EVENTS.path(lake)).version()
    at = row["event_time"]
    assert isinstance(at, dt.datetime)
    minute = at.replace(second=0, microsecond=0)
    click = row["event_type"] == "click"
    write_arrivals(lake, version, [ctr_row(minute, 0 if click else 1, 1 if click else 0)])


def _impression_and_its_click(spark: SparkSession, lake: LakeSettings) -> None:
    record(lake, "ctr", 3, "published", "clicks attributed")  # what `make demo` publishes
    _arrive(spark, lake, event("imp", "impression", H + 5 * MINUTE))


def _click(spark: SparkSession, lake: LakeSettings) -> None:
    click = event("clk", "click", H + 55 * MINUTE)
    click["impression_id"] = "i-imp"  # the impression's, 50 minutes after it
    _arrive(spark, lake, click)


def test_a_run_covers_the_settled_minutes_only_so_a_click_in_time_leaves_nothing_stale(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Version 3 settles 70 min after a minute. At 13:00 nothing of [12:00,
    13:00) has settled: the run skips it and says so. A click at 12:55 on the impression of
    12:05 arrives on time (13:01); at 14:30 a run over [12:00, 14:30) covers [12:00, 13:20),
    counts the click exactly, and nothing is stale."""
    lake = new_lake(tmp_path)
    _impression_and_its_click(spark, lake)
    assert read_registry(lake).published("ctr").version == 3
    notes: list[str] = []
    at_13 = H + 60 * MINUTE
    assert (
        recompute(spark, lake, [Interval(H, at_13)], on_step=notes.append, clock=lambda: at_13)
        == []
    )
    assert notes[0].startswith("skipped [2026-11-22T12:00:00+00:00, 2026-11-22T13:00:00+00:00)")
    assert "settles 70 min after a minute" in notes[0]

    _click(spark, lake)
    at_1430 = H + 150 * MINUTE
    [run] = recompute(
        spark, lake, [Interval(H, at_1430)], on_step=notes.append, clock=lambda: at_1430
    )
    assert run.interval == Interval(H, H + 80 * MINUTE)
    assert any(
        n.startswith("covering [2026-11-22T12:00:00+00:00, 2026-11-22T13:20:00+00:00)")
        for n in notes
    )
    rows = DeltaTable(lake.table("batch/ctr_v3")).to_pyarrow_table().to_pylist()
    assert [
        (r["bucket_start"], r["impressions"], r["clicks"]) for r in rows if r["impressions"]
    ] == [(H + 5 * MINUTE, 1, 1)]
    assert read_stale(lake) == []


def test_covering_unsettled_minutes_makes_an_on_time_click_stale(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What the settle delay prevents: asked to cover the unsettled hour at 13:00
    (``unsettled``), the run makes 12:05 exact too early; the same click, on time at 13:01,
    marks the impression's minute stale (and its own)."""
    lake = new_lake(tmp_path)
    _impression_and_its_click(spark, lake)
    at_13 = H + 60 * MINUTE
    [run] = recompute(spark, lake, [Interval(H, at_13)], unsettled=True, clock=lambda: at_13)
    assert run.interval == Interval(H, at_13)
    _click(spark, lake)
    stale = {b.bucket_start for b in read_stale(lake)}
    assert {H + 5 * MINUTE, H + 55 * MINUTE} <= stale
