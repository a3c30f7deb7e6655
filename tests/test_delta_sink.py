"""The delta-rs sink through a real SparkSession, read back by deltalake, DuckDB and Spark."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from connectors import read_delta, write_delta
from connectors.duckdb_delta import delta_duckdb
from infra.spark import SparkSettings

ROWS = [
    (1, "a", dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)),
    (2, "b", dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, 11, 0, tzinfo=dt.UTC)),
    (3, "c", dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 9, 0, tzinfo=dt.UTC)),
    (4, None, dt.date(2026, 1, 2), None),
]
SCHEMA = "id long, name string, day date, at timestamp"


def frame(spark: SparkSession, rows: Sequence[tuple[object, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA).repartition(2)


def ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def test_append_partitioned_is_readable_by_every_reader(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    write_delta(frame(spark, ROWS), str(path), spark_settings=spark_settings, partition_by=["day"])
    table = DeltaTable(str(path))
    assert table.metadata().partition_columns == ["day"]
    assert ids(path) == [1, 2, 3, 4]
    assert sorted(p.name for p in path.iterdir()) == [
        "_delta_log",
        "day=2026-01-01",
        "day=2026-01-02",
    ]

    actions = pa.table(table.get_add_actions()).to_pylist()
    assert sum(a["num_records"] for a in actions) == 4
    by_day = {a["partition"]["day"]: a for a in actions if a["num_records"] == 2}
    assert set(by_day) <= {dt.date(2026, 1, 1), dt.date(2026, 1, 2)}
    for action in actions:
        assert action["min"]["id"] <= action["max"]["id"]
        assert set(action["null_count"]) == {"id", "name", "at"}
    # Timestamps are stored at millisecond precision, rounded outward so the bounds hold.
    log = "".join(p.read_text() for p in (path / "_delta_log").glob("*.json"))
    assert '\\"at\\":\\"2026-01-01T10:00:00.123Z\\"' in log  # min, rounded down
    assert '\\"at\\":\\"2026-01-01T10:00:00.124Z\\"' in log  # max, rounded up

    con = delta_duckdb()
    got = con.execute(
        f"SELECT id, name, day FROM delta_scan('{path}') WHERE day = DATE '2026-01-02' ORDER BY id"
    ).fetchall()
    assert got == [(3, "c", dt.date(2026, 1, 2)), (4, None, dt.date(2026, 1, 2))]
    spark_rows = read_delta(spark, str(path), spark_settings=spark_settings).orderBy("id").collect()
    assert [tuple(r) for r in spark_rows] == [
        (1, "a", dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, 10, 0, 0, 123456)),
        (2, "b", dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, 11, 0)),
        (3, "c", dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 9, 0)),
        (4, None, dt.date(2026, 1, 2), None),
    ]  # Spark shows UTC instants as naive datetimes in the session time zone (UTC)


def test_overwrite_replaces_everything(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    write_delta(frame(spark, ROWS), path, spark_settings=spark_settings)
    write_delta(frame(spark, ROWS[:1]), path, spark_settings=spark_settings, mode="overwrite")
    assert ids(Path(path)) == [1]
    assert DeltaTable(path).version() == 1
    old = read_delta(spark, path, spark_settings=spark_settings, version=0)
    assert sorted(r.id for r in old.collect()) == [1, 2, 3, 4]  # time travel


def test_replace_where_touches_only_matching_rows(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    write_delta(frame(spark, ROWS), path, spark_settings=spark_settings, partition_by=["day"])
    # id 2 shares a file with id 1: that file is rewritten without it, id 1 survives.
    new = [(20, "z", dt.date(2026, 1, 1), None), (30, "y", dt.date(2026, 1, 2), None)]
    write_delta(
        frame(spark, new), path, spark_settings=spark_settings, mode="overwrite",
        replace_where="id >= 2 AND id < 40",
    )  # fmt: skip
    assert ids(Path(path)) == [1, 20, 30]
    assert DeltaTable(path).version() == 1  # one atomic commit
    history = DeltaTable(path).history(1)[0]
    assert history["operation"] == "WRITE"


def test_replace_where_refuses_rows_outside_the_predicate(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    write_delta(frame(spark, ROWS), path, spark_settings=spark_settings)
    before = sorted(p.name for p in Path(path).iterdir())
    with pytest.raises(Exception, match=r"written row\(s\) do not match the predicate 'id < 5'"):
        write_delta(
            frame(spark, ROWS[:2] + [(9, "x", dt.date(2026, 1, 3), None)] * 2), path,
            spark_settings=spark_settings, mode="overwrite", replace_where="id < 5",
        )  # fmt: skip
    assert DeltaTable(path).version() == 0
    assert ids(Path(path)) == [1, 2, 3, 4]
    assert sorted(p.name for p in Path(path).iterdir()) == before  # aborted: no files left


def test_a_failed_job_leaves_no_visible_change(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    write_delta(frame(spark, ROWS), str(path), spark_settings=spark_settings)
    files_before = {p for p in path.rglob("*.parquet")}
    failing = frame(spark, ROWS).selectExpr("id", "name", "day", "at", "assert_true(id < 4) AS x")
    with pytest.raises(Exception, match="id < 4"):
        write_delta(failing.drop("x").where("x IS NULL"), str(path), spark_settings=spark_settings)
    assert DeltaTable(str(path)).version() == 0
    assert ids(path) == [1, 2, 3, 4]
    assert {p for p in path.rglob("*.parquet")} == files_before


def test_idempotent_writes_by_application_and_version(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    batch = frame(spark, ROWS[:2])
    write_delta(batch, path, spark_settings=spark_settings, txn=("app-1", 7))
    write_delta(batch, path, spark_settings=spark_settings, txn=("app-1", 7))  # a replay
    write_delta(batch, path, spark_settings=spark_settings, txn=("app-1", 6))  # older: no-op
    assert ids(Path(path)) == [1, 2]
    write_delta(batch, path, spark_settings=spark_settings, txn=("app-1", 8))
    write_delta(batch, path, spark_settings=spark_settings, txn=("app-2", 7))
    assert ids(Path(path)) == [1, 1, 1, 2, 2, 2]
    assert DeltaTable(path).transaction_version("app-1") == 8
    assert len(list(Path(path).glob("*.parquet"))) == 3  # skipped writes cleaned up


def test_a_replayed_micro_batch_is_a_no_op(
    spark: SparkSession, spark_settings: SparkSettings, tmp_path: Path
) -> None:
    source, checkpoint, path = tmp_path / "in", tmp_path / "ck", tmp_path / "t"
    spark.createDataFrame([(n,) for n in range(5)], "id long").write.parquet(str(source))

    def run() -> None:
        query = (
            spark.readStream.schema("id long").parquet(str(source))
            .writeStream.format("ctr-delta").option("path", str(path))
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)

    run()
    assert ids(path) == [0, 1, 2, 3, 4]
    # Forget that batch 0 finished: Spark runs it again on restart, as after a crash.
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    run()
    assert ids(path) == [0, 1, 2, 3, 4]
    assert DeltaTable(str(path)).version() == 0
