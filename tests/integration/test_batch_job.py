"""The batch job on small inline event sets: real Spark, real Delta tables on disk."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from batch_layer.interval import Interval, IntervalError
from batch_layer.job import MissingTableError, dedup_partitions, deduplicate, interval_events, run
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from tests.support.events import archive, event

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
HOUR = Interval(T0, T0 + dt.timedelta(hours=1))


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def view(lake: LakeSettings) -> list[tuple[object, ...]]:
    table = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table()
    return sorted(
        (r["bucket_start"], r["ad_id"], r["impressions"], r["clicks"]) for r in table.to_pylist()
    )


def coverage(lake: LakeSettings) -> list[dict[str, object]]:
    return sorted(
        DeltaTable(lake.table("batch/coverage")).to_pyarrow_table().to_pylist(),
        key=lambda r: (r["interval_start"], r["run_id"]),
    )


def test_counts_are_exact_deduplicated_and_bounded(spark: SparkSession, lake: LakeSettings) -> None:
    rows = [
        event("a", "impression", at(0)),  # exactly at start: counted
        event("a", "impression", at(0), offset=9),  # the same event again: not counted twice
        event("b", "impression", at(0.5)),
        event("c", "click", at(1)),
        event("d", "impression", at(59.99), ad="ad-2"),
        event("e", "impression", at(60)),  # exactly at end: not in this interval
        event("f", "impression", at(-1)),  # before start: not in this interval
    ]
    archive(spark, lake, rows)
    result = run(spark, HOUR, lake=lake)
    assert view(lake) == [
        (at(0), "ad-1", 2, 0),
        (at(1), "ad-1", 0, 1),
        (at(59), "ad-2", 1, 0),
    ]
    assert result.rows_written == 3
    [row] = coverage(lake)
    assert (row["interval_start"], row["interval_end"], row["rows_written"]) == (at(0), at(60), 3)
    assert row["input_version"] == 0
    assert row["view"] == "ctr"
    table = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table()
    assert set(table.column("run_id").to_pylist()) == {result.run_id}


def test_of_copies_that_differ_the_first_archived_counts(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """Copies of one event_id with different contents: the lowest (ingest time, Kafka
    partition, offset) is the one counted, whatever order the files list them in."""

    def copy(
        ad: str, minute: float, ingested: float, partition: int, offset: int
    ) -> dict[str, object]:
        row = event("x", "impression", at(minute), ad=ad, offset=offset)
        return {**row, "kafka_partition": partition, "ingest_time": at(ingested)}

    archive(spark, lake, [copy("late", 1, 9, 0, 0)])
    archive(spark, lake, [copy("tie-later-offset", 2, 5, 1, 8), copy("earliest", 3, 5, 1, 7)])
    archive(spark, lake, [copy("tie-later-partition", 4, 5, 2, 0)])
    # A second event, whose only copy ingested last, is counted too.
    archive(spark, lake, [event("y", "click", at(6), ad="other")])
    run(spark, HOUR, lake=lake)
    assert view(lake) == [(at(3), "earliest", 1, 0), (at(6), "other", 0, 1)]


def test_the_dedup_sorts_each_row_once_in_partitions_sized_by_the_input(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """No partial first-row-per-id (and its sort of every row) before the exchange by
    event_id: Spark plans one when the window's input is not exchanged by event_id already."""
    archive(
        spark, lake, [event("a", "impression", at(0)), event("a", "impression", at(0), offset=1)]
    )
    events, partitions, _ = interval_events(
        spark, MASTER_EVENTS.path(lake), DeltaTable(MASTER_EVENTS.path(lake)), HOUR
    )
    plan = deduplicate(events, partitions)._jdf.queryExecution().executedPlan().toString()
    assert "WindowGroupLimit" in plan  # the limit after the exchange: first row per id
    assert "Partial" not in plan
    assert plan.count("Exchange hashpartitioning(event_id") == 1
    assert partitions == spark.sparkContext.defaultParallelism  # a few KB: one per core
    assert [r.kafka_offset for r in deduplicate(events, partitions).collect()] == [0]


@pytest.mark.parametrize(
    ("input_bytes", "parallelism", "partitions"),
    [(0, 2, 2), (32 * 2**20, 2, 2), (347 * 2**20, 2, 11), (347 * 2**20, 16, 16)],
)
def test_dedup_partitions_hold_about_32_mib_of_input_each(
    input_bytes: int, parallelism: int, partitions: int
) -> None:
    assert dedup_partitions(input_bytes, parallelism) == partitions


def test_dedup_partitions_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="parallelism >= 1"):
        dedup_partitions(1, 0)


def test_late_events_count_when_their_interval_is_recomputed_and_reruns_are_identical(
    spark: SparkSession, lake: LakeSettings
) -> None:
    archive(spark, lake, [event("a", "impression", at(5))])
    first = run(spark, HOUR, lake=lake)
    again = run(spark, HOUR, lake=lake)
    assert again.run_id == first.run_id
    assert view(lake) == [(at(5), "ad-1", 1, 0)]
    # A click for that minute arrives late (archived later): the next run counts it.
    archive(spark, lake, [event("late", "click", at(5.5), offset=1)])
    late = run(spark, HOUR, lake=lake)
    assert late.input_version == 1
    assert view(lake) == [(at(5), "ad-1", 1, 1)]
    assert [r["run_id"] for r in coverage(lake)] == sorted([first.run_id, late.run_id])


def test_rows_outside_the_interval_are_untouched_and_an_empty_interval_writes_nothing(
    spark: SparkSession, lake: LakeSettings
) -> None:
    archive(spark, lake, [event("a", "impression", at(10)), event("b", "impression", at(70))])
    run(spark, Interval(at(0), at(120)), lake=lake)
    assert view(lake) == [(at(10), "ad-1", 1, 0), (at(70), "ad-1", 1, 0)]
    # An hour with no events: no rows, a coverage row saying so, nothing else touched.
    empty = run(spark, Interval(at(120), at(180)), lake=lake)
    assert empty.rows_written == 0
    assert view(lake) == [(at(10), "ad-1", 1, 0), (at(70), "ad-1", 1, 0)]
    # Recomputing the second hour replaces its row and leaves the first hour's alone.
    run(spark, Interval(at(60), at(120)), lake=lake)
    assert view(lake) == [(at(10), "ad-1", 1, 0), (at(70), "ad-1", 1, 0)]
    assert [r["rows_written"] for r in coverage(lake)] == [2, 1, 0]


def test_no_coverage_without_committed_rows(
    spark: SparkSession, lake: LakeSettings, tmp_path: Path
) -> None:
    archive(spark, lake, [event("a", "impression", at(1))])
    blocker = Path(lake.table("batch/ctr"))
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a table")  # the view's write fails
    with pytest.raises(OSError, match="Not a directory"):
        run(spark, HOUR, lake=lake)
    assert not DeltaTable.is_deltatable(lake.table("batch/coverage"))


def test_clear_errors_for_bad_arguments(lake: LakeSettings, spark: SparkSession) -> None:
    with pytest.raises(IntervalError, match=r"end \(.*\) must be after start"):
        Interval.parse("2026-11-22T10:00:00Z", "2026-11-22T10:00:00Z")
    with pytest.raises(IntervalError, match="start: 'yesterday' is not an ISO-8601 time"):
        Interval.parse("yesterday", "2026-11-22T10:00:00Z")
    with pytest.raises(IntervalError, match="must be a whole minute"):
        Interval.parse("2026-11-22T10:00:30Z", "2026-11-22T11:00:00Z")
    with pytest.raises(MissingTableError, match="run `ctr archive` first"):
        run(spark, HOUR, lake=lake)
    assert [str(h) for h in Interval.parse("2026-11-22T10:30", "2026-11-22T12:00").hours()] == [
        "[2026-11-22T10:30:00+00:00, 2026-11-22T11:00:00+00:00)",
        "[2026-11-22T11:00:00+00:00, 2026-11-22T12:00:00+00:00)",
    ]


def test_backfill_command_runs_hour_by_hour(spark: SparkSession, lake: LakeSettings) -> None:
    import os
    import subprocess
    import sys

    rows = [
        event("a", "impression", at(10)),
        event("b", "click", at(70)),
        event("c", "impression", at(155)),  # 12:35, past --to
    ]
    archive(spark, lake, rows)
    env = {**os.environ, "LAKE_ROOT": str(lake.lake_root), "SPARK_MASTER": "local[1]"}

    def backfill(start: str, end: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).with_name("ctr")), "backfill", "--from", start, "--to", end],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    done = backfill("2026-11-22T10:00Z", "2026-11-22T12:30Z")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "backfilled 3 of 3 hour(s)" in done.stderr
    assert view(lake) == [(at(10), "ad-1", 1, 0), (at(70), "ad-1", 0, 1)]
    intervals = [(r["interval_start"], r["interval_end"]) for r in coverage(lake)]
    assert intervals == [(at(0), at(60)), (at(60), at(120)), (at(120), at(150))]
    bad = backfill("2026-11-22T12:00Z", "2026-11-22T11:00Z")
    assert bad.returncode == 2
    assert "must be after --from" in bad.stderr  # the flags typed
