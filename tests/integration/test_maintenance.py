"""Maintenance through delta-rs on real Delta tables (written by Spark here): compaction and
vacuum (the speed tables' own maintenance: tests/integration/test_speed_tables.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lake.catalog import BATCH_CTR
from lake.frames import commit_frame
from lake.maintenance import compact_and_vacuum, compact_and_vacuum_all, full_vacuum_due
from lake.settings import LakeSettings


def test_compaction_merges_small_files_and_keeps_rows(
    spark: SparkSession, lake: LakeSettings
) -> None:
    path = lake.table("batch/coverage")
    for n in range(4):
        one_file = spark.createDataFrame([(n,)], "n long").coalesce(1)
        one_file.write.format("delta").mode("append").save(path)
    report = compact_and_vacuum(lake, "batch/coverage", retention_hours=0)
    assert report is not None
    assert (report.files_added, report.files_removed, report.files_vacuumed) == (1, 4, 4)
    assert sorted(DeltaTable(path).to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2, 3]
    assert len(DeltaTable(path).file_uris()) == 1
    assert compact_and_vacuum(lake, "speed/ctr") is None  # no table yet: nothing to do


def test_a_batch_view_is_compacted_hour_by_hour(lake: LakeSettings) -> None:
    """A batch view's files never straddle an hour (a run replaces whole files: lake/view_files):
    compaction merges an hour's small files into one and splits a file of the older layout into
    hour files, rows unchanged; a second pass finds nothing to do."""
    path = lake.table("batch/ctr")
    t0 = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)

    def append(*minutes: int) -> None:
        rows = [
            {**dict.fromkeys(BATCH_CTR.schema.names), "bucket_start": t0 + dt.timedelta(minutes=m),
             "impressions": m, "clicks": 0, "run_id": "r"}
            for m in minutes
        ]  # fmt: skip
        frame = pa.Table.from_pylist(rows, BATCH_CTR.schema)
        commit_frame(frame, path, lake.object_store, BATCH_CTR.schema)

    for minutes in ((5,), (20,), (65,), (90,), (125, 185)):  # the last: one file, two hours
        append(*minutes)
    report = compact_and_vacuum(lake, "batch/ctr", retention_hours=0)
    assert report is not None
    assert (report.files_added, report.files_removed, report.files_vacuumed) == (4, 5, 5)
    files = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    hours = sorted(
        (low.hour, high.hour)
        for low, high in zip(
            files.column("min.bucket_start").to_pylist(),
            files.column("max.bucket_start").to_pylist(),
            strict=True,
        )
    )
    assert hours == [(10, 10), (11, 11), (12, 12), (13, 13)]
    impressions = DeltaTable(path).to_pyarrow_table().column("impressions").to_pylist()
    assert sorted(impressions) == [5, 20, 65, 90, 125, 185]
    again = compact_and_vacuum(lake, "batch/ctr", retention_hours=0)
    assert again is not None
    assert (again.files_added, again.files_removed) == (0, 0)


def test_vacuum_keeps_files_for_a_retention_under_an_hour(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A VACUUM that rounded RETAIN to whole hours (delta-spark did) made 15 minutes 0 and deleted
    files a writer had just replaced (or was about to commit). The table's property rules."""
    lake = LakeSettings(lake_root=tmp_path / "lake", vacuum_retention_hours=0.25)
    path = lake.table("batch/ctr")
    spark.createDataFrame([(0,)], "n long").coalesce(1).write.format("delta").save(path)
    spark.createDataFrame([(1,)], "n long").coalesce(1).write.format("delta").mode(
        "overwrite"
    ).save(path)
    report = compact_and_vacuum(lake, "batch/ctr")
    assert report is not None
    assert report.files_vacuumed == 0  # the replaced file waits out its 15 minutes
    assert len(list(Path(path).glob("*.parquet"))) == 2
    with pytest.raises(ValueError, match="whole hours"):
        compact_and_vacuum(lake, "batch/ctr", retention_hours=0.25)


def test_every_table_is_maintained_in_one_driver_and_a_failure_is_named_at_the_end(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """The DAG's one task: a broken table does not keep the next ones from their compaction,
    and the task still fails, naming it."""
    broken = Path(lake.table("batch/coverage")) / "_delta_log"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.json").write_text("not a commit\n")
    path = lake.table("batch/drift")
    for n in range(3):
        spark.createDataFrame([(n,)], "n long").coalesce(1).write.format("delta").mode(
            "append"
        ).save(path)
    with pytest.raises(RuntimeError, match="maintenance failed for batch/coverage"):
        compact_and_vacuum_all(lake, ["batch/coverage", "batch/drift", "batch/ctr"])
    assert len(DeltaTable(path).file_uris()) == 1
    reports = compact_and_vacuum_all(lake, ["batch/drift", "batch/ctr"])
    assert [(r.table, r.files_removed) for r in reports] == [("batch/drift", 0)]


@pytest.mark.parametrize(
    ("start", "end", "full"),
    [
        ("2026-11-28T00:00:00+00:00", "2026-11-29T00:00:00+00:00", True),  # @daily
        ("2026-11-28T03:00:00+00:00", "2026-11-29T03:00:00+00:00", True),  # daily at 03:00
        ("2026-11-28T00:00:00+00:00", "2026-11-28T01:00:00+00:00", True),  # the day's first
        ("2026-11-28T01:00:00+00:00", "2026-11-28T02:00:00+00:00", False),  # hourly, later
        ("2026-11-28T00:15:00+00:00", "2026-11-28T00:30:00+00:00", False),
        ("2026-11-28T01:00:00+01:00", "2026-11-28T02:00:00+01:00", True),  # midnight UTC
    ],
)
def test_the_dags_pass_vacuums_in_full_once_a_day(start: str, end: str, full: bool) -> None:
    assert full_vacuum_due(dt.datetime.fromisoformat(start), dt.datetime.fromisoformat(end)) is full
    assert full_vacuum_due(None, None)  # by hand


def test_a_lite_vacuum_leaves_files_no_commit_named_for_the_full_one(lake: LakeSettings) -> None:
    """A failed run's files (written, never committed) are found only by listing the table:
    the lite passes leave them, the day's full one deletes them."""
    path = lake.table("batch/coverage")
    commit_frame(pa.table({"n": [1]}), path, lake.object_store, pa.schema([("n", pa.int64())]))
    orphan = Path(path) / "part-00000-never-committed.snappy.parquet"
    pq.write_table(pa.table({"n": [2]}), orphan)
    lite = compact_and_vacuum(lake, "batch/coverage", retention_hours=0, full_vacuum=False)
    assert lite is not None
    assert (lite.files_vacuumed, lite.full_vacuum) == (0, False)
    assert orphan.exists()
    full = compact_and_vacuum(lake, "batch/coverage", retention_hours=0)
    assert full is not None
    assert full.files_vacuumed == 1
    assert not orphan.exists()
