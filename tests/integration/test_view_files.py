"""A batch view's interval written by Spark's tasks and committed by the driver
(lake/view_files.py): hour files, rows outside the interval kept, older layouts rewritten,
concurrent runs over the same hours conflicting, a run committed once. Real Spark, real Delta
tables on disk."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession

from batch_layer.interval import Interval
from batch_layer.job import run
from lake import view_files
from lake.catalog import BATCH_CTR
from lake.data_files import DataFile, HourFiles, merge_stats
from lake.frames import commit_frame
from lake.settings import LakeSettings
from runtime.object_store import ObjectStoreSettings
from tests.support.events import archive, event

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def rows(lake: LakeSettings) -> list[tuple[object, ...]]:
    table = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table()
    return sorted(
        (r["bucket_start"], r["ad_id"], r["impressions"], r["clicks"], r["run_id"])
        for r in table.to_pylist()
    )


def file_ranges(lake: LakeSettings) -> list[tuple[dt.datetime, dt.datetime]]:
    files = pa.table(DeltaTable(lake.table("batch/ctr")).get_add_actions(flatten=True))
    return sorted(
        zip(
            files.column("min.bucket_start").to_pylist(),
            files.column("max.bucket_start").to_pylist(),
            strict=True,
        )
    )


def hour_of(moment: dt.datetime) -> dt.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def test_tasks_write_one_file_per_hour_and_a_partial_interval_keeps_the_rest(
    spark: SparkSession, lake: LakeSettings
) -> None:
    archive(spark, lake, [event(f"e{m}", "impression", at(m)) for m in (5, 30, 65, 100, 130)])
    first = run(spark, Interval(at(0), at(180)), lake=lake)
    assert first.rows_written == 5
    # One file per hour with rows: none straddles an hour.
    assert [(hour_of(lo), hour_of(hi)) for lo, hi in file_ranges(lake)] == [
        (at(0), at(0)),
        (at(60), at(60)),
        (at(120), at(120)),
    ]
    # A late click in 10:30; a run over [10:15, 10:45) only: the hour's file is replaced, its
    # row at 10:05 rewritten as it was (still the first run's), the 10:30 row recomputed.
    archive(spark, lake, [event("late", "click", at(30.5), offset=1)])
    second = run(spark, Interval(at(15), at(45)), lake=lake)
    assert second.rows_written == 1
    assert rows(lake) == [
        (at(5), "ad-1", 1, 0, first.run_id),
        (at(30), "ad-1", 1, 1, second.run_id),
        (at(65), "ad-1", 1, 0, first.run_id),
        (at(100), "ad-1", 1, 0, first.run_id),
        (at(130), "ad-1", 1, 0, first.run_id),
    ]
    assert len(file_ranges(lake)) == 3


def test_a_file_of_an_older_layout_is_rewritten_as_hour_files(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """Lakes written before the hour layout hold files across many hours (a run's whole
    interval, a compaction): the first run touching one rewrites it as hour files."""
    legacy = [
        {**dict.fromkeys(BATCH_CTR.schema.names), "bucket_start": at(m), "ad_id": "old",
         "impressions": 7, "clicks": 0, "run_id": "legacy"}
        for m in (10, 70, 130)
    ]  # fmt: skip
    commit_frame(pa.Table.from_pylist(legacy, BATCH_CTR.schema), lake.table("batch/ctr"),
                 lake.object_store, BATCH_CTR.schema)  # fmt: skip
    assert len(file_ranges(lake)) == 1  # one file over three hours
    archive(spark, lake, [event("a", "impression", at(75))])
    second_hour = run(spark, Interval(at(60), at(120)), lake=lake)
    assert rows(lake) == [
        (at(10), "old", 7, 0, "legacy"),
        (at(75), "ad-1", 1, 0, second_hour.run_id),
        (at(130), "old", 7, 0, "legacy"),
    ]
    assert all(hour_of(lo) == hour_of(hi) for lo, hi in file_ranges(lake))


def test_a_view_without_reach_stores_it_null_and_keeps_the_carried_rows_reach(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """The benchmark's run without reach sends only the columns it computes to the tasks (the
    tasks add the rest, null); rows outside its interval, rewritten from the hour's file, keep
    the user numbers of the run that wrote them."""
    archive(spark, lake, [event(f"e{m}", "impression", at(m)) for m in (5, 30)])
    run(spark, Interval(at(0), at(60)), lake=lake)
    archive(spark, lake, [event("late", "click", at(30.5), offset=1)])
    run(spark, Interval(at(15), at(45)), lake=lake, reach=False)
    table = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table()
    reached = {r["bucket_start"]: (r["clicks"], r["user_nos"]) for r in table.to_pylist()}
    assert reached == {at(5): (0, [1]), at(30): (1, None)}  # "u", the dictionary's first user
    assert len(file_ranges(lake)) == 1


def write_hour(lake: LakeSettings, hour: dt.datetime, run_id: str) -> list[DataFile]:
    """Files of one row at ``hour``, written as a task would (not committed)."""
    row = {**dict.fromkeys(BATCH_CTR.schema.names), "bucket_start": hour, "impressions": 1,
           "clicks": 0, "run_id": run_id}  # fmt: skip
    files = HourFiles(
        "batch/ctr", lake.table("batch/ctr"), lake.object_store, BATCH_CTR.schema, "bucket_start"
    )
    files.write(pa.Table.from_pylist([row], BATCH_CTR.schema), counted=True)
    return files.close()


def test_two_runs_over_the_same_hours_conflict_even_where_no_file_was(
    lake: LakeSettings,
) -> None:
    """Both runs open the table, write, commit: the second is refused (the batch job reruns
    it), also when the hours held no file to remove; runs over other hours both land."""
    path = lake.table("batch/ctr")
    hour = Interval(at(0), at(60))
    first = view_files.open_table(path, lake.object_store, BATCH_CTR.schema)
    second = view_files.open_table(path, lake.object_store, BATCH_CTR.schema)
    assert view_files.replaced_files(first, hour) == []
    view_files.commit(first, write_hour(lake, at(0), "a"), [], interval=hour, run_id="a",
                      input_version=1)  # fmt: skip
    with pytest.raises(CommitFailedError):
        view_files.commit(second, write_hour(lake, at(0), "b"), [], interval=hour, run_id="b",
                          input_version=1)  # fmt: skip
    # Rerun on a fresh handle: it replaces the first run's file.
    again = view_files.open_table(path, lake.object_store, BATCH_CTR.schema)
    replaced = view_files.replaced_files(again, hour)
    assert len(replaced) == 1
    view_files.commit(again, write_hour(lake, at(0), "b"), replaced, interval=hour, run_id="b",
                      input_version=1)  # fmt: skip
    # Another hour, opened before that commit: no conflict.
    other = Interval(at(60), at(120))
    view_files.commit(second, write_hour(lake, at(60), "c"), [], interval=other, run_id="c",
                      input_version=1)  # fmt: skip
    runs = sorted(DeltaTable(path).to_pyarrow_table().column("run_id").to_pylist())
    assert runs == ["b", "c"]


def test_a_run_committed_before_commits_nothing(spark: SparkSession, lake: LakeSettings) -> None:
    archive(spark, lake, [event("a", "impression", at(5))])
    view = spark.createDataFrame([], "bucket_start timestamp")  # never read: nothing to write
    first = run(spark, Interval(at(0), at(60)), lake=lake)
    version = DeltaTable(lake.table("batch/ctr")).version()
    again = view_files.replace_interval(
        spark, view, name="batch/ctr", path=lake.table("batch/ctr"), store=lake.object_store,
        schema=BATCH_CTR.schema, interval=Interval(at(0), at(60)), run_id=first.run_id,
        input_version=0,
    )  # fmt: skip
    assert not again.committed
    assert DeltaTable(lake.table("batch/ctr")).version() == version
    # Its ids carry their time, and the table forgets them after its history window (a
    # snapshot would otherwise hold every run and hour ever committed).
    table = DeltaTable(lake.table("batch/ctr"))
    assert (
        table.metadata().configuration["delta.setTransactionRetentionDuration"]
        == (lake.retention("batch/ctr")["delta.setTransactionRetentionDuration"])
    )
    log = Path(lake.table("batch/ctr")) / "_delta_log" / f"{version:020d}.json"
    ids = [json.loads(line)["txn"] for line in log.read_text().splitlines() if '"txn"' in line]
    assert {i["appId"] for i in ids} == {first.run_id, "ctr-batch-hour:20261122T10"}
    assert all(i["lastUpdated"] > 0 for i in ids)


def test_file_statistics_merge_across_batches() -> None:
    """A file written batch by batch states the bounds of all its rows; a bound one batch
    could not state (a long string) is left out, an all-null batch changes nothing."""
    one = {"numRecords": 2, "minValues": {"n": 1, "s": "b"}, "maxValues": {"n": 5, "s": "c"},
           "nullCount": {"n": 0, "s": 0}}  # fmt: skip
    two = {"numRecords": 1, "minValues": {"n": 0, "s": "a"}, "maxValues": {"n": 3},
           "nullCount": {"n": 0, "s": 0}}  # fmt: skip
    nulls = {"numRecords": 3, "minValues": {}, "maxValues": {}, "nullCount": {"n": 3, "s": 3}}
    assert merge_stats(one, two) == {
        "numRecords": 3,
        "minValues": {"n": 0, "s": "a"},
        "maxValues": {"n": 5},
        "nullCount": {"n": 0, "s": 0},
    }
    assert merge_stats(one, nulls)["minValues"] == one["minValues"]
    assert merge_stats(one, nulls)["maxValues"] == one["maxValues"]
    assert merge_stats(one, nulls)["nullCount"] == {"n": 3, "s": 3}


def test_a_task_splits_its_rows_by_hour_and_rolls_files_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lake.data_files.ROWS_PER_FILE", 2)
    schema = pa.schema([("bucket_start", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])
    local = ObjectStoreSettings()  # a local path: the store is never asked
    files = HourFiles("t", str(tmp_path), local, schema, "bucket_start")
    batch = [{"bucket_start": at(m), "n": m} for m in (1, 2, 3, 61)]
    files.write(pa.Table.from_pylist(batch, schema), counted=True)
    files.write(pa.Table.from_pylist([{"bucket_start": at(62), "n": 62}], schema))
    written = files.close()
    stats = [json.loads(f["stats"]) for f in written]
    assert sorted((s["numRecords"], s["minValues"]["n"], s["maxValues"]["n"]) for s in stats) == [
        (2, 61, 62),
        (3, 1, 3),
    ]  # a file closes after the batch that fills it
    assert sorted(files.counted.values()) == [1, 3]
    files.write(pa.Table.from_pylist([{"bucket_start": at(63), "n": 63}], schema))
    assert len(files.close()) == 3  # the full file was closed: a new one took the row


def test_a_view_larger_than_the_drivers_result_limit_is_written(
    lake: LakeSettings, tmp_path: Path
) -> None:
    """`ctr batch` with spark.driver.maxResultSize at Spark's minimum (1m), over two hours
    whose view is several times that: nothing of the view is collected to the driver."""
    import os
    import subprocess
    import sys

    from events.records import EVENTS_SCHEMA
    from lake.catalog import MASTER_EVENTS

    events = [
        {"event_id": f"e{n}", "event_type": "click" if n % 7 == 0 else "impression",
         "event_time": at(n % 120 + (n % 60) / 60), "impression_id": f"i{n}",
         "ad_id": f"ad-{n % 997}", "campaign_id": f"cmp-{n % 89}", "site_id": f"site-{n % 13}",
         "country": ("US", "DE", "FR", "JP", "BR")[n % 5], "device_type": "mobile",
         "user_id": f"user-{n:08d}", "schema_version": 1, "event_date": T0.date(),
         "kafka_partition": 0, "kafka_offset": n, "ingest_time": at(n % 120)}
        for n in range(40_000)
    ]  # fmt: skip
    commit_frame(pa.Table.from_pylist(events, EVENTS_SCHEMA), MASTER_EVENTS.path(lake),
                 lake.object_store, EVENTS_SCHEMA, partition_by=["event_date"])  # fmt: skip
    env = {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "RUN_DIR": str(tmp_path / "run"),
        "SPARK_MASTER": "local[2]",
        "SPARK_CONF": json.dumps({"spark.driver.maxResultSize": "1m"}),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ctr")), "batch",
         "--start", "2026-11-22T10:00Z", "--end", "2026-11-22T12:00Z"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    table = DeltaTable(lake.table("batch/ctr"))
    view = table.to_pyarrow_table()
    assert sum(view.column("impressions").to_pylist()) + sum(
        view.column("clicks").to_pylist()
    ) == len(events)
    assert view.num_rows > 30_000  # (minute, ad, campaign, site, country) nearly all distinct
    assert view.nbytes > 4 * 2**20  # the view, as Arrow, is over four times the limit
    assert all(hour_of(lo) == hour_of(hi) for lo, hi in file_ranges(lake))


@pytest.mark.parametrize(
    ("hours", "input_bytes", "parallelism", "expected"),
    [
        (24, 10 * 2**30, 2, (2, 1)),  # a day on 2 cores: the hours over the cores
        (24, 10 * 2**30, 200, (48, 2)),  # on 200 cores: 10 GiB, 2 tasks an hour
        (1, 100, 200, (1, 1)),  # a small hour: one task, one file
        (1, 2 * 2**30, 200, (8, 8)),  # a busy hour: 8 tasks of 256 MiB
        (1, 2 * 2**30, 3, (3, 3)),  # as far as the cores go
        (5000, 2**40, 4000, (1024, 1)),  # never more than MAX_WRITE_TASKS
    ],
)
def test_a_busy_hour_is_written_by_several_tasks(
    hours: int, input_bytes: int, parallelism: int, expected: tuple[int, int]
) -> None:
    assert view_files.write_tasks(hours, input_bytes, parallelism) == expected


def test_an_hour_split_over_tasks_still_writes_only_that_hours_files(
    spark: SparkSession, lake: LakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(view_files, "WRITE_INPUT_BYTES_PER_TASK", 1)  # every hour "busy"
    ads = [f"ad-{n}" for n in range(40)]
    archive(spark, lake, [event(f"e{n}", "impression", at(n), ad=ad) for n, ad in enumerate(ads)])
    result = run(spark, Interval(at(0), at(60)), lake=lake)
    assert result.rows_written == 40
    ranges = file_ranges(lake)
    assert len(ranges) == spark.sparkContext.defaultParallelism  # the hour over every core
    assert all(hour_of(lo) == hour_of(hi) == at(0) for lo, hi in ranges)
    assert sorted(str(r[1]) for r in rows(lake)) == sorted(ads)
