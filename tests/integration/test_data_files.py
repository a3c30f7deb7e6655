"""Data files written apart from their commit (lake.data_files) and committed by the table's
writer (AppendTable.commit): statistics readers can trust, partitions, a replay that adds
nothing, and the three readers of the lake (delta-rs, delta-spark, DuckDB) agreeing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lake.append_table import AppendTable
from lake.data_files import STRING_STATS_CHARS, file_stats, write_files
from lake.duckdb_delta import delta_duckdb
from runtime.object_store import ObjectStoreSettings

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("n", pa.int64()),
        ("raw", pa.binary()),
        ("day", pa.date32()),
    ]
)
T0 = dt.datetime(2026, 11, 22, 10, 0, 0, 123_456, tzinfo=dt.UTC)
LONG = "x" * (STRING_STATS_CHARS + 5)
# The tables here are local paths: the object store is never asked (lake.storage).
LOCAL = ObjectStoreSettings()


def rows(*items: tuple[str | None, dt.datetime, int | None, dt.date | None]) -> pa.Table:
    return pa.table(
        {
            "id": [i[0] for i in items],
            "at": [i[1] for i in items],
            "n": [i[2] for i in items],
            "raw": [b"r" for _ in items],
            "day": [i[3] for i in items],
        },
        schema=SCHEMA,
    )


def test_statistics_bound_every_row() -> None:
    day = T0.date()
    stats = file_stats(
        rows(
            ("a", T0, 5, day),
            (LONG, T0 + dt.timedelta(microseconds=1), None, day),
            (None, T0 - dt.timedelta(seconds=1), -2, day),
        )
    )
    assert stats["numRecords"] == 3
    assert stats["nullCount"] == {"id": 1, "at": 0, "n": 1, "raw": 0, "day": 0}
    # Milliseconds, the minimum rounded down and the maximum up: every row stays inside.
    assert stats["minValues"] == {
        "id": "a",
        "at": "2026-11-22T09:59:59.123Z",
        "n": -2,
        "day": "2026-11-22",
    }
    # A string longer than the limit has no maximum (its prefix would be below it); binary
    # columns have null counts only.
    assert stats["maxValues"] == {"at": "2026-11-22T10:00:00.124Z", "n": 5, "day": "2026-11-22"}


def test_a_long_minimum_is_cut_to_a_prefix_and_exact_times_stay_exact() -> None:
    whole = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    stats = file_stats(rows((LONG + "b", whole, 1, whole.date()), (LONG + "c", whole, 2, None)))
    assert stats["minValues"]["id"] == LONG[:STRING_STATS_CHARS]  # type: ignore[index]
    assert stats["minValues"]["at"] == stats["maxValues"]["at"] == "2026-11-22T10:00:00.000Z"  # type: ignore[index]


def test_a_column_of_nulls_has_no_bounds() -> None:
    table = rows((None, T0, None, T0.date()))
    stats = file_stats(table)
    assert "id" not in stats["minValues"]  # type: ignore[operator]
    assert "n" not in stats["maxValues"]  # type: ignore[operator]
    assert stats["nullCount"]["id"] == 1  # type: ignore[index]


def test_one_file_per_partition_without_the_partition_column(tmp_path: Path) -> None:
    d1, d2 = dt.date(2026, 11, 22), dt.date(2026, 11, 23)
    table = rows(("a", T0, 1, d1), ("b", T0, 2, d2), ("c", T0, 3, d1))
    files = write_files("t", str(tmp_path), LOCAL, table, ["day"], dictionary=["id"])
    by_day = {json.loads(f["partition_values"])["day"]: f for f in files}
    assert sorted(by_day) == ["2026-11-22", "2026-11-23"]
    first = by_day["2026-11-22"]
    assert first["path"].startswith("day=2026-11-22/")
    assert first["table"] == "t"
    assert json.loads(first["stats"])["numRecords"] == 2
    written = pa.parquet.read_table(tmp_path / first["path"])
    assert written.column_names == ["id", "at", "n", "raw"]
    assert written.column("id").to_pylist() == ["a", "c"]
    assert first["size"] == (tmp_path / first["path"]).stat().st_size
    # Only the columns asked for are dictionary-encoded.
    chunks = pa.parquet.ParquetFile(tmp_path / first["path"]).metadata.row_group(0)
    encodings = {chunks.column(i).path_in_schema: chunks.column(i).encodings for i in range(4)}
    assert any("DICTIONARY" in e for e in encodings["id"])
    assert not any("DICTIONARY" in e for e in encodings["n"])
    assert write_files("t", str(tmp_path), LOCAL, table.slice(0, 0), ["day"]) == []


def test_a_partition_value_that_needs_escaping_is_refused(tmp_path: Path) -> None:
    table = pa.table({"k": ["a/b"], "v": [1]})
    with pytest.raises(ValueError, match="escaping"):
        write_files("t", str(tmp_path), LOCAL, table, ["k"])


def test_committed_files_read_alike_everywhere_and_a_replay_adds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    table = AppendTable(
        path, LOCAL, SCHEMA, partition_by=["day"], properties={"delta.appendOnly": "true"}
    )
    day = T0.date()
    latest = T0 + dt.timedelta(microseconds=1)  # between two milliseconds
    first = rows(("a", T0, 1, day), ("b", latest, 2, day))
    assert table.commit(write_files("t", path, LOCAL, first, ["day"]), app_id="w", version=0)
    # A replay of version 0 (its files written again, as Spark's retry would) commits nothing.
    assert not table.commit(write_files("t", path, LOCAL, first, ["day"]), app_id="w", version=0)
    second = rows(("c", T0, 3, day + dt.timedelta(days=1)))
    assert table.commit(write_files("t", path, LOCAL, second, ["day"]), app_id="w", version=1)

    rs = DeltaTable(path)
    assert rs.version() == 2  # created, then two appends
    assert rs.transaction_version("w") == 1
    assert rs.metadata().configuration["delta.appendOnly"] == "true"
    assert rs.count() == 3  # delta-rs answers from numRecords
    assert sorted(rs.to_pyarrow_table().column("id").to_pylist()) == ["a", "b", "c"]

    # delta-spark and DuckDB skip files by the statistics: a filter on the latest microsecond
    # still finds its row.
    frame = spark.read.format("delta").load(path)
    at_latest = frame.where(frame.at == latest).select("id", "day").collect()
    assert [(r.id, r.day) for r in at_latest] == [("b", day)]
    assert frame.where(frame.at > latest).count() == 0
    assert frame.count() == 3

    with delta_duckdb() as con:
        found = con.execute(
            f"SELECT id FROM delta_scan('{path}') WHERE \"at\" = ? ORDER BY id", [latest]
        ).fetchall()
    assert found == [("b",)]


def test_maintain_packs_small_files_and_vacuums_what_no_version_needs(tmp_path: Path) -> None:
    """The writer's own maintenance: a file per commit becomes a file per partition, the rows
    and the application transaction stay, and the packed files go, with a file a crashed
    attempt wrote and never committed (which only a full VACUUM finds)."""
    path = str(tmp_path / "t")
    keep_none = {"delta.deletedFileRetentionDuration": "interval 0 minutes"}
    table = AppendTable(path, LOCAL, SCHEMA, partition_by=["day"], properties=keep_none)
    day = T0.date()
    for n in range(4):
        batch = rows((f"e{n}", T0, n, day), (f"f{n}", T0, n, day + dt.timedelta(days=1)))
        assert table.commit(write_files("t", path, LOCAL, batch, ["day"]), app_id="w", version=n)
    orphan = write_files("t", path, LOCAL, rows(("lost", T0, 9, day)), ["day"])  # never committed
    assert len(DeltaTable(path).file_uris()) == 8

    done = table.maintain()

    assert (done.files_removed, done.files_added) == (8, 2)
    assert done.files_vacuumed == 8 + len(orphan)
    rs = DeltaTable(path)
    assert len(rs.file_uris()) == 2
    assert sorted(rs.to_pyarrow_table().column("id").to_pylist()) == sorted(
        [f"e{n}" for n in range(4)] + [f"f{n}" for n in range(4)]
    )
    on_disk = {p.name for p in (tmp_path / "t").rglob("*.parquet")}
    assert on_disk == {Path(uri).name for uri in rs.file_uris()}
    assert rs.transaction_version("w") == 3
    assert not table.commit(write_files("t", path, LOCAL, batch, ["day"]), app_id="w", version=3)
    assert table.maintain().files_removed == 0  # nothing small left to pack


def test_a_pass_compacts_the_latest_partitions_first_and_a_lite_vacuum_leaves_orphans(
    tmp_path: Path,
) -> None:
    """A bounded pass: at most ``partitions_per_pass`` partitions with small files (the most
    recently written first), the others left for the next pass; a lite VACUUM deletes the
    files the log removed, and only a full one the files no commit ever named."""
    path = str(tmp_path / "t")
    keep_none = {"delta.deletedFileRetentionDuration": "interval 0 minutes"}
    table = AppendTable(path, LOCAL, SCHEMA, partition_by=["day"], properties=keep_none)
    day = T0.date()
    version = 0
    for offset in (0, 1, 2):  # the later day written last
        for n in range(2):
            batch = rows((f"d{offset}-{n}", T0, n, day + dt.timedelta(days=offset)))
            assert table.commit(
                write_files("t", path, LOCAL, batch, ["day"]), app_id="w", version=version
            )
            version += 1
    orphan = write_files("t", path, LOCAL, rows(("lost", T0, 9, day)), ["day"])  # never committed

    first = table.maintain(partitions_per_pass=1, full_vacuum=False)

    assert (first.files_removed, first.files_added, first.partitions_left) == (2, 1, 2)
    files = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    per_day = files.group_by("partition.day").aggregate([("path", "count")]).to_pylist()
    assert {r["partition.day"]: r["path_count"] for r in per_day} == {
        day: 2,
        day + dt.timedelta(days=1): 2,
        day + dt.timedelta(days=2): 1,
    }
    assert first.files_vacuumed == 2  # the two packed files, not the orphan
    assert (tmp_path / "t" / orphan[0]["path"]).exists()
    second = table.maintain(partitions_per_pass=8, full_vacuum=True)
    assert (second.files_removed, second.partitions_left) == (4, 0)
    assert not (tmp_path / "t" / orphan[0]["path"]).exists()
    rs = DeltaTable(path)
    on_disk = {p.name for p in (tmp_path / "t").rglob("*.parquet")}
    assert on_disk == {Path(uri).name for uri in rs.file_uris()}  # the packed ones gone too
    assert rs.to_pyarrow_table().num_rows == 6


def test_a_relative_root_is_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    [written] = write_files("t", "lake/t", LOCAL, rows(("a", T0, 1, T0.date())))
    assert (tmp_path / "lake" / "t" / written["path"]).stat().st_size == written["size"]
