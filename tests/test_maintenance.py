"""Maintenance through delta-rs on real Delta tables (written by Spark here): compaction and
vacuum (the speed tables' own maintenance: tests/test_speed_tables.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lake.maintenance import compact_and_vacuum, compact_and_vacuum_all
from lake.settings import LakeSettings


def test_compaction_merges_small_files_and_keeps_rows(
    spark: SparkSession, lake: LakeSettings
) -> None:
    path = lake.table("batch/ctr")
    for n in range(4):
        one_file = spark.createDataFrame([(n,)], "n long").coalesce(1)
        one_file.write.format("delta").mode("append").save(path)
    report = compact_and_vacuum(lake, "batch/ctr", retention_hours=0)
    assert report is not None
    assert (report.files_added, report.files_removed, report.files_vacuumed) == (1, 4, 4)
    assert sorted(DeltaTable(path).to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2, 3]
    assert len(DeltaTable(path).file_uris()) == 1
    assert compact_and_vacuum(lake, "speed/ctr") is None  # no table yet: nothing to do


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
