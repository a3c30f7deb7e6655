"""The ad-hoc SQL sandbox: the registered views answer; files, writes, extensions, settings
and runaway queries do not."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from infra.lake import LakeSettings
from serving_layer import SqlError, SqlRefusedError, run_sql
from serving_layer.tables import LakeSnapshot, SnapshotSource
from tests.lake_writer import cover, ctr_row, minute, write, write_batch, write_speed


@pytest.fixture
def snapshot(tmp_path: Path) -> LakeSnapshot:
    lake = LakeSettings(lake_root=tmp_path / "lake", checkpoint_root=tmp_path / "ck")
    write_batch(lake, "run-a", [ctr_row(minute(0), 10, 1), ctr_row(minute(1), 20, 2)])
    cover(lake, "run-a", minute(0), minute(1))
    write_speed(lake, [ctr_row(minute(0), 99, 9), ctr_row(minute(1), 30, 3)])
    write(
        lake,
        "master/rejected",
        [
            {
                "value": b"{",
                "key": None,
                "reason": "record: not JSON",
                "kafka_topic": "ad-events",
                "kafka_partition": 0,
                "kafka_offset": 5,
                "kafka_timestamp": minute(0),
            }
        ],
    )
    return SnapshotSource(lake, refresh_s=0).current()


def test_merged_view_and_tables(snapshot: LakeSnapshot) -> None:
    result = run_sql(
        "SELECT bucket_start, impressions, clicks, source, run_id FROM ctr ORDER BY 1", snapshot
    )
    assert result.columns == ["bucket_start", "impressions", "clicks", "source", "run_id"]
    assert [row[1:] for row in result.rows] == [(10, 1, "batch", "run-a"), (30, 3, "speed", None)]
    assert run_sql("SELECT count(*) FROM events", snapshot).rows == [(0,)]
    assert run_sql("SELECT reason, value FROM rejected", snapshot).rows == [
        ("record: not JSON", b"{")
    ]
    assert run_sql("SELECT interval_start, interval_end FROM covered", snapshot).rows == [
        (minute(0), minute(1))
    ]


def test_row_limit_truncates(snapshot: LakeSnapshot) -> None:
    result = run_sql("SELECT * FROM range(100)", snapshot, max_rows=7)
    assert (len(result.rows), result.truncated) == (7, True)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("COPY (SELECT 1) TO '/tmp/ctr-sandbox.csv'", "COPY statements are not allowed"),
        ("ATTACH '/tmp/ctr-sandbox.db' AS x", "ATTACH statements are not allowed"),
        ("INSTALL httpfs", "INSTALL statements are not allowed"),
        ("LOAD httpfs", "LOAD statements are not allowed"),
        ("SET enable_external_access = true", "SET statements are not allowed"),
        ("RESET lock_configuration", "RESET statements are not allowed"),
        ("PRAGMA version", "PRAGMA statements are not allowed"),
        ("-- a comment\nPRAGMA database_list", "PRAGMA statements are not allowed"),
        ("CREATE TABLE t AS SELECT 1", "CREATE statements are not allowed"),
        ("DROP VIEW ctr", "DROP statements are not allowed"),
        ("INSERT INTO coverage SELECT * FROM coverage", "INSERT statements are not allowed"),
        ("CALL pragma_version()", "CALL statements are not allowed"),
        ("SELECT 1; SELECT 2", "one statement per query, got 2"),
        ("  ", "the query is empty"),
    ],
)
def test_refused_statements(snapshot: LakeSnapshot, sql: str, message: str) -> None:
    with pytest.raises(SqlRefusedError, match=message):
        run_sql(sql, snapshot)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_parquet('/etc/*.parquet')",
    ],
)
def test_files_outside_the_tables_are_denied(snapshot: LakeSnapshot, sql: str) -> None:
    with pytest.raises(SqlError, match="file system operations are disabled by configuration"):
        run_sql(sql, snapshot)


def test_python_objects_are_not_reachable(snapshot: LakeSnapshot) -> None:
    with pytest.raises(SqlError, match="Catalog Error"):
        run_sql("SELECT * FROM snapshot", snapshot)


def test_errors_are_reported(snapshot: LakeSnapshot) -> None:
    with pytest.raises(SqlError, match="Table with name nope does not exist"):
        run_sql("SELECT * FROM nope", snapshot)
    with pytest.raises(SqlError, match="syntax error"):
        run_sql("SELEC 1", snapshot)


def test_a_long_cross_join_is_stopped_at_the_time_limit(snapshot: LakeSnapshot) -> None:
    started = time.monotonic()
    with pytest.raises(SqlError, match="stopped at the time limit of 1 s"):
        run_sql(
            "SELECT count(*) FROM range(1000000) a, range(1000000) b, range(1000) c "
            "WHERE a.range + b.range + c.range = -1",
            snapshot,
            timeout_s=1.0,
        )
    assert time.monotonic() - started < 10


def test_timestamps_are_utc(snapshot: LakeSnapshot) -> None:
    [(value,)] = run_sql("SELECT min(bucket_start) FROM ctr_batch", snapshot).rows
    assert isinstance(value, dt.datetime)
    assert value.utcoffset() == dt.timedelta(0)
