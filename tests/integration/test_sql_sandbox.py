"""The ad-hoc SQL sandbox: which statements run (DuckDB's parser decides), a database that can
write nowhere even when handed a write, and worker processes with hard limits."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from lake.settings import LakeSettings
from runtime.object_store import ObjectStoreSettings
from serving_layer.sandbox.database import (
    SANDBOX_VIEWS,
    VIEW_NAMES,
    SqlError,
    SqlRefusedError,
    check_read_only,
    open_sandbox,
)
from serving_layer.sandbox.pool import SqlBusyError, SqlPool
from serving_layer.snapshots import LakeSnapshot, SnapshotSource
from tests.support.lake_writer import RUNAWAY_REGEX, build_sandbox_lake, lake_digest
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    return build_sandbox_lake(tmp_path_factory.mktemp("sandbox"))


@pytest.fixture(scope="module")
def snapshot(lake: LakeSettings) -> LakeSnapshot:
    return SnapshotSource(lake, refresh_s=0).current()


@pytest.fixture(scope="module")
def pool() -> Iterator[SqlPool]:
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=1.0)
    yield pool
    pool.close()


# -- which statements run ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "runs"),
    [
        ("SELECT 1", "SELECT 1"),
        ("  -- a comment\nFROM ctr", "  -- a comment\nFROM ctr"),
        ("WITH a AS (SELECT 1) SELECT * FROM a", "WITH a AS (SELECT 1) SELECT * FROM a"),
        ("(SELECT 1)", "(SELECT 1)"),
        ("SUMMARIZE ctr", "SUMMARIZE ctr"),
        ("DESCRIBE ctr", "DESCRIBE ctr"),
        ("SHOW TABLES", "SHOW TABLES"),
        ("VALUES (1), (2)", "VALUES (1), (2)"),
        ("EXPLAIN SELECT 1", "EXPLAIN SELECT 1"),
        ("explain /* the plan */ select 1", "EXPLAIN select 1"),
    ],
)
def test_queries_are_accepted(sql: str, runs: str) -> None:
    assert check_read_only(sql) == runs


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 42 AS x", "EXPLAIN ANALYZE"),
        ("EXPLAIN ANALYZE INSERT INTO coverage SELECT * FROM coverage", "EXPLAIN ANALYZE"),
        ("EXPLAIN ANALYZE COPY (SELECT 'x') TO '/tmp/x.csv'", "EXPLAIN ANALYZE"),
        ("explain analyse select 1", "EXPLAIN ANALYZE"),
        ("EXPLAIN /* c */ ANALYZE SELECT 1", "EXPLAIN ANALYZE"),
        ("EXPLAIN (ANALYZE) SELECT 1", "EXPLAIN with options"),
        ("EXPLAIN (FORMAT json) SELECT 1", "EXPLAIN with options"),
        ("EXPLAIN CREATE TABLE t AS SELECT 1", "CREATE statements are not allowed"),
        ("EXPLAIN PRAGMA version", "PRAGMA statements are not allowed"),
        ("/* /* */ SELECT */ PRAGMA version", "PRAGMA statements are not allowed"),
        ("PRAGMA version", "PRAGMA statements are not allowed"),
        ("-- a comment\nPRAGMA database_list", "PRAGMA statements are not allowed"),
        ("COPY (SELECT 1) TO '/tmp/ctr-sandbox.csv'", "COPY statements are not allowed"),
        ("ATTACH '/tmp/ctr-sandbox.db' AS x", "ATTACH statements are not allowed"),
        ("INSTALL httpfs", "INSTALL statements are not allowed"),
        ("LOAD httpfs", "LOAD statements are not allowed"),
        ("SET enable_external_access = true", "SET statements are not allowed"),
        ("RESET lock_configuration", "RESET statements are not allowed"),
        ("CREATE TABLE t AS SELECT 1", "CREATE statements are not allowed"),
        ("DROP VIEW ctr", "DROP statements are not allowed"),
        ("INSERT INTO coverage SELECT * FROM coverage", "INSERT statements are not allowed"),
        ("WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a", "statements are not allowed"),
        ("CALL pragma_version()", "CALL statements are not allowed"),
        ("PIVOT ctr ON source USING sum(clicks)", "one statement per query"),
        ("SELECT 1; SELECT 2", "one statement per query, got 2"),
        ("SELECT 1; /* */ COPY ctr TO 'x'", "one statement per query, got 2"),
        ("  ", "the query is empty"),
    ],
)
def test_everything_else_is_refused(sql: str, message: str) -> None:
    with pytest.raises(SqlRefusedError, match=re.escape(message)):
        check_read_only(sql)


def test_syntax_errors_are_reported() -> None:
    with pytest.raises(SqlError, match="syntax error"):
        check_read_only("SELEC 1")


# -- the database writes nowhere, even when handed a write --------------------------------------


@pytest.fixture
def sandbox(snapshot: LakeSnapshot) -> Iterator[duckdb.DuckDBPyConnection]:
    tables = {view: snapshot[name] for view, name in SANDBOX_VIEWS.items()}
    con = open_sandbox(tables, ObjectStoreSettings(), memory_limit_bytes=256 * 2**20)
    yield con
    con.close()


def test_writes_fail_in_the_database_itself(
    sandbox: duckdb.DuckDBPyConnection, lake: LakeSettings, snapshot: LakeSnapshot, tmp_path: Path
) -> None:
    """The statement check is bypassed here: the database alone must refuse every write."""
    before = lake_digest(lake)
    target = snapshot["master/events"].files[0]
    outside = tmp_path / "written.csv"
    for statement in (
        f"COPY (SELECT 'x' AS pwned) TO '{target}' (FORMAT csv, USE_TMP_FILE false)",
        f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{target}' (FORMAT csv, USE_TMP_FILE false)",
        f"COPY (SELECT 1) TO '{outside}'",
        f"ATTACH '{tmp_path / 'x.duckdb'}' AS x",
        f"EXPORT DATABASE '{tmp_path / 'export'}'",
        f"SELECT * FROM read_parquet('{target}')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "INSTALL httpfs",
    ):
        with pytest.raises(duckdb.Error, match=r"Permission Error|disabled|locked|not allowed"):
            sandbox.execute(statement)
    assert lake_digest(lake) == before
    assert not outside.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_views_read_the_snapshot(sandbox: duckdb.DuckDBPyConnection) -> None:
    assert sandbox.execute("SELECT event_id, event_date FROM events ORDER BY 1").fetchall() == [
        ("e0", dt.date(2026, 11, 22)),
        ("e1", dt.date(2026, 11, 22)),
    ]


# -- worker processes ------------------------------------------------------------------------


def test_merged_view_and_tables(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    result = pool.run(
        "SELECT bucket_start, impressions, clicks, source, run_id FROM ctr ORDER BY 1", snapshot
    )
    assert result.columns == ["bucket_start", "impressions", "clicks", "source", "run_id"]
    assert result.rows == [
        ["2026-11-22T10:00:00Z", 10, 1, "batch", "run-a"],
        ["2026-11-22T10:01:00Z", 30, 3, "speed", None],
    ]
    assert pool.run("SELECT count(*) FROM events", snapshot).rows == [[2]]
    assert pool.run("SELECT reason, value FROM rejected", snapshot).rows == [
        ["record: not JSON", "{"]
    ]
    assert pool.run("SELECT * FROM covered", snapshot).rows == [
        ["2026-11-22T10:00:00Z", "2026-11-22T10:01:00Z"]
    ]
    assert pool.run("SHOW TABLES", snapshot).rows == [[name] for name in sorted(VIEW_NAMES)]


def test_values_are_json_ready(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    result = pool.run(
        "SELECT 170141183460469231731687303715884105727::HUGEINT, 1.5::DECIMAL(4, 2), "
        "'nan'::DOUBLE, '\\xff'::BLOB, "
        "[1, 2], {'a': 1}, INTERVAL 90 MINUTE",
        snapshot,
    )
    assert result.rows == [
        [
            "170141183460469231731687303715884105727",
            "1.50",
            "nan",
            "base64:/w==",
            [1, 2],
            {"a": 1},
            "1:30:00",
        ]
    ]


def test_row_and_byte_caps(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    rows = pool.run("SELECT * FROM range(100)", snapshot, max_rows=7)
    assert (len(rows.rows), rows.truncated_by) == (7, "max_rows")
    # Rows of 1,000 characters: ["xxx…"] is 1,005 bytes of JSON with its comma.
    capped = pool.run(
        "SELECT repeat('x', 1000) FROM range(100)", snapshot, max_rows=100, max_bytes=10_000
    )
    assert (len(capped.rows), capped.truncated_by) == (9, "max_bytes")
    whole = pool.run("SELECT * FROM range(3)", snapshot)
    assert (whole.rows, whole.truncated, whole.truncated_by) == ([[0], [1], [2]], False, None)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_parquet('/etc/*.parquet')",
    ],
)
def test_file_readers_are_refused(pool: SqlPool, snapshot: LakeSnapshot, sql: str) -> None:
    with pytest.raises(SqlRefusedError, match="file system operations are disabled"):
        pool.run(sql, snapshot)


def test_files_named_as_tables_are_denied(
    pool: SqlPool, snapshot: LakeSnapshot, sandbox: duckdb.DuckDBPyConnection
) -> None:
    # A path in FROM is no function call: the table allow-list refuses it, and the database
    # itself denies it.
    with pytest.raises(SqlRefusedError, match=r"/etc/\*.parquet is not allowed \(the sandbox"):
        pool.run("SELECT * FROM '/etc/*.parquet'", snapshot)
    with pytest.raises(duckdb.Error, match="file system operations are disabled by configuration"):
        sandbox.execute("SELECT * FROM '/etc/*.parquet'")


def test_errors_are_reported(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    with pytest.raises(SqlRefusedError, match="the table nope is not allowed: a query reads"):
        pool.run("SELECT * FROM nope", snapshot)
    # A near miss names the view meant, never a catalog table the sandbox refuses (pg_class).
    with pytest.raises(
        SqlRefusedError, match=r"ctr_batchh is not allowed \(did you mean ctr_batch\?\)"
    ):
        pool.run("SELECT * FROM ctr_batchh", snapshot)
    with pytest.raises(SqlError, match='Referenced column "nope" not found'):
        pool.run("SELECT nope FROM ctr", snapshot)
    with pytest.raises(SqlRefusedError, match="COPY statements are not allowed"):
        pool.run("COPY ctr TO 'x.csv'", snapshot)


def test_memory_is_bounded_per_worker(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    # 1 GB in one string, twice the worker's 512 MiB.
    with pytest.raises(SqlError, match="Out of Memory"):
        pool.run("SELECT length(repeat('x', 1000000000))", snapshot)
    assert pool.run("SELECT 42", snapshot).rows == [[42]]


def test_worker_processes_are_confined(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    pool.run("SELECT 1", snapshot)
    [pid] = pool.worker_pids()
    limits = {
        line[:26].strip(): line[26:].split()[:2]
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    }
    assert limits["Max file size"] == ["0", "0"]
    assert limits["Max core file size"] == ["0", "0"]
    address_space = int(limits["Max address space"][0])
    assert address_space < 4 * 2**30  # what it mapped at start + 512 MiB + slack
    assert limits["Max cpu time"][0] != "unlimited"
    assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 10
    workdir = Path(os.readlink(f"/proc/{pid}/cwd"))
    assert workdir.name.startswith("ctr-sql-")
    assert list(workdir.iterdir()) == []
    assert "API_TOKEN" not in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


def test_a_runaway_query_is_killed_at_the_time_limit(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    pool.run("SELECT 1", snapshot)
    [pid] = pool.worker_pids()
    restarts = pool.stats().worker_restarts
    timed_out = pool.stats().timed_out
    with pytest.raises(SqlError, match="stopped at the time limit of 1 s"):
        pool.run(RUNAWAY_REGEX, snapshot, timeout_s=1.0)
    # Stopped by the pool's kill after its wait of the limit and the grace, not run to its end
    # (~40 s of CPU; it would answer) nor stopped by its CPU limit (another message): one
    # time-out counted, and the worker is gone.
    assert pool.stats().timed_out == timed_out + 1
    assert not Path(f"/proc/{pid}").exists() or pid not in pool.worker_pids()
    assert pool.run("SELECT 'next'", snapshot).rows == [["next"]]
    assert pool.stats().worker_restarts == restarts + 1


def test_an_interruptible_query_stops_at_the_limit_without_a_kill(
    request: pytest.FixtureRequest, snapshot: LakeSnapshot
) -> None:
    # A minute's grace: DuckDB's interrupt stops it first, however slow the machine.
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=60.0)
    request.addfinalizer(pool.close)
    pool.run("SELECT 1", snapshot)
    restarts = pool.stats().worker_restarts
    with pytest.raises(SqlError, match="stopped at the time limit of 1 s"):
        pool.run(
            "SELECT count(*) FROM range(1000000) a, range(1000000) b, range(1000) c "
            "WHERE a.range + b.range + c.range = -1",
            snapshot,
            timeout_s=1.0,
        )
    assert pool.stats().worker_restarts == restarts


def test_a_full_pool_says_busy(snapshot: LakeSnapshot) -> None:
    small = SqlPool(workers=1, queue_size=0, memory_bytes=128 * 2**20, grace_s=0.5)
    try:
        with small.admission(), pytest.raises(SqlBusyError, match="too many SQL queries"):
            small.run("SELECT 1", snapshot)
        assert small.stats().rejected_busy == 1
        assert small.run("SELECT 1", snapshot).rows == [[1]]
    finally:
        small.close()


def test_a_crashed_worker_is_replaced(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    pool.run("SELECT 1", snapshot)
    [pid] = pool.worker_pids()
    restarts = pool.stats().worker_restarts
    os.kill(pid, 9)
    wait_until(
        lambda: pid not in pool.worker_pids(),  # a zombie
        timeout_s=60,
        what="the killed worker ended",
    )
    # Dead between queries: the next query gets a fresh worker, not the dead one's error
    # (test_sql_hardening.py: a worker that dies during a query).
    assert pool.run("SELECT 2", snapshot).rows == [[2]]
    assert pool.worker_pids() != [pid]
    assert pool.stats().worker_restarts == restarts + 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_rows": 0}, "'max_rows' must be >= 1"),
        ({"max_bytes": 0}, "'max_bytes' must be >= 1"),
        ({"timeout_s": 0}, "'timeout_s' must be > 0"),
    ],
)
def test_bad_arguments(
    pool: SqlPool, snapshot: LakeSnapshot, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pool.run("SELECT 1", snapshot, **kwargs)  # type: ignore[arg-type]


def test_ctr_sql_runs_in_the_sandbox(lake: LakeSettings) -> None:
    env = {**os.environ, "LAKE_ROOT": str(lake.lake_root), "CHECKPOINT_ROOT": str(lake.lake_root)}

    def ctr_sql(*args: str) -> subprocess.CompletedProcess[str]:
        ctr = Path(sys.executable).with_name("ctr")
        return subprocess.run(
            [str(ctr), "sql", *args], env=env, capture_output=True, text=True, check=False
        )

    answer = ctr_sql("SELECT event_id FROM events ORDER BY 1", "--format", "csv")
    assert (answer.returncode, answer.stdout.splitlines()) == (0, ["event_id", "e0", "e1"])
    # A text cell a spreadsheet would run is neutralised, a number is not.
    formula = ctr_sql("SELECT '=1+1' AS f, -2 AS n", "--format", "csv")
    assert formula.stdout.splitlines() == ["f,n", "'=1+1,-2"]
    refused = ctr_sql("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1")
    assert refused.returncode == 1
    assert "refused: EXPLAIN ANALYZE" in " ".join(refused.stderr.split())
    bad_size = ctr_sql("SELECT 1", "--memory", "lots")
    assert bad_size.returncode == 2
    assert "not a size: 'lots'" in bad_size.stderr
