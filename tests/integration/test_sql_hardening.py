"""The SQL sandbox, second round (issue 32): only allowed functions run, and a refused query
never reaches a worker; a client whose query costs a worker is backed off, others are not; the
workers' private directories go with them."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from access.roles import Access, Scope
from lake.settings import LakeSettings
from serving_layer.sandbox.backoff import ClientBackoff
from serving_layer.sandbox.database import (
    FunctionRefusedError,
    SqlError,
    SqlRefusedError,
    check_read_only,
)
from serving_layer.sandbox.functions import (
    ALLOWED_FUNCTIONS,
    ALLOWED_TABLE_FUNCTIONS,
    FUNCTION_GROUPS,
)
from serving_layer.sandbox.pool import SqlBusyError, SqlPool
from serving_layer.snapshots import LakeSnapshot, SnapshotSource
from tests.support.fake_clock import FakeClock
from tests.support.lake_writer import RUNAWAY_REGEX, build_sandbox_lake
from tests.support.waiting import wait_until
from views import sketches

# 1 GB in one string: twice the pool's memory, DuckDB's "Out of Memory Error" in a moment.
OUT_OF_MEMORY = "SELECT length(repeat('x', 1000000000))"


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> LakeSnapshot:
    lake: LakeSettings = build_sandbox_lake(tmp_path_factory.mktemp("hardening"))
    return SnapshotSource(lake, refresh_s=0).current()


@pytest.fixture
def pool() -> Iterator[SqlPool]:
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=1.0)
    yield pool
    pool.close()


# -- only allowed functions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "function"),
    [
        ("SELECT * FROM pandas_scan(NULL)", "pandas_scan"),
        ("select * from PANDAS_SCAN(NULL)", "pandas_scan"),  # DuckDB folds the case
        ('SELECT * FROM "pandas_scan"(NULL)', "pandas_scan"),
        ("SELECT * FROM arrow_scan(NULL, NULL, NULL)", "arrow_scan"),
        ("SELECT * FROM python_map_function(NULL, NULL, NULL)", "python_map_function"),
        ("FROM query('SELECT 1')", "query"),
        ("FROM query_table('ctr')", "query_table"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
        ("SELECT * FROM glob('/etc/*')", "glob"),
        ("SELECT * FROM duckdb_settings()", "duckdb_settings"),
        ("SELECT * FROM duckdb_functions()", "duckdb_functions"),
        ("SELECT * FROM pragma_version()", "pragma_version"),
        ("SELECT * FROM pragma_table_info('ctr')", "pragma_table_info"),
        ("SELECT * FROM test_all_types()", "test_all_types"),
        ("SELECT * FROM json_execute_serialized_sql('{}')", "json_execute_serialized_sql"),
        ("SELECT getenv('HOME')", "getenv"),
        ("SELECT current_setting('threads')", "current_setting"),
        ("SELECT getvariable('x')", "getvariable"),
        ("SELECT nextval('s')", "nextval"),
        ("SELECT sleep_ms(100000)", "sleep_ms"),
        ("SELECT json_serialize_plan('SELECT 1')", "json_serialize_plan"),
        ("SELECT pg_catalog.pg_size_pretty(1)", "pg_size_pretty"),
        # Hidden in a subquery, a CTE, a window, ORDER BY, HAVING, a lateral join, a lambda,
        # COLUMNS(…), LIMIT, a join, behind EXPLAIN, DESCRIBE or SUMMARIZE.
        ("SELECT (SELECT max(s) FROM (SELECT current_setting('threads') AS s))", "current_setting"),
        ("WITH a AS (SELECT getenv('HOME') AS h) SELECT * FROM a", "getenv"),
        ("SELECT sum(clicks) OVER (PARTITION BY getenv('x')) FROM ctr", "getenv"),
        ("SELECT source FROM ctr ORDER BY current_setting('threads')", "current_setting"),
        ("SELECT source FROM ctr GROUP BY 1 HAVING max(getenv('x')) > ''", "getenv"),
        ("SELECT * FROM ctr, LATERAL (SELECT * FROM pandas_scan(ctr.source))", "pandas_scan"),
        ("SELECT list_transform(['a'], x -> getenv(x))", "getenv"),
        ("SELECT COLUMNS(c -> current_setting(c) IS NULL) FROM ctr", "current_setting"),
        ("SELECT 1 LIMIT (SELECT nextval('s'))", "nextval"),
        ("SELECT * FROM ctr JOIN read_parquet('x') USING (source)", "read_parquet"),
        ("EXPLAIN SELECT * FROM pandas_scan(NULL)", "pandas_scan"),
        ("DESCRIBE SELECT * FROM query('SELECT 1')", "query"),
        ("SUMMARIZE SELECT getenv('HOME')", "getenv"),
        ("SELECT * FROM (PIVOT ctr ON source IN ('batch') USING any_value(getenv('x')))", "getenv"),
    ],
)
def test_functions_off_the_allow_list_are_refused(sql: str, function: str) -> None:
    with pytest.raises(FunctionRefusedError, match=rf"function {re.escape(function)}\(\)") as info:
        check_read_only(sql)
    assert info.value.function == function


def test_refusals_say_where_the_allowed_functions_are() -> None:
    with pytest.raises(SqlRefusedError, match="GET /api/v1/sql/functions"):
        check_read_only("SELECT getenv('HOME')")
    with pytest.raises(
        SqlRefusedError, match="the allowed table functions: generate_series, range, unnest"
    ):
        check_read_only("SELECT * FROM duckdb_settings()")


@pytest.mark.parametrize(
    "sql",
    [
        # The docs' (Getting started, the README) and the demo's examples.
        "SELECT source, count(*) AS rows, sum(impressions) AS impressions, sum(clicks) AS clicks "
        "FROM ctr GROUP BY source",
        "SELECT source, sum(clicks) FROM ctr GROUP BY 1",
        "SELECT count(*) AS events, count(DISTINCT event_id) AS distinct_ids FROM events",
        # An analyst's library: aggregates, windows, dates, text, lists, structs, JSON, lambdas.
        "SELECT date_trunc('hour', bucket_start) AS h, sum(clicks) / nullif(sum(impressions), 0), "
        "strftime(h, '%H'), epoch_ms(h), extract(hour FROM h), time_bucket(INTERVAL 5 MINUTE, h) "
        "FROM ctr GROUP BY h HAVING count(*) > 0 ORDER BY h",
        "SELECT count(*) FILTER (WHERE clicks > 0), count_if(clicks > 0), median(clicks), "
        "quantile_cont(clicks, [0.1, 0.9]), approx_count_distinct(ad_id), mode(country), "
        "string_agg(country, ',' ORDER BY country), arg_max(ad_id, clicks), stddev(clicks), "
        "corr(clicks, impressions), histogram(country), list(clicks), bool_or(clicks > 1) FROM ctr",
        "SELECT row_number() OVER w, rank() OVER w, dense_rank() OVER w, percent_rank() OVER w, "
        "cume_dist() OVER w, ntile(4) OVER w, lag(clicks) OVER w, lead(clicks, 2, 0) OVER w, "
        "first_value(clicks) OVER w, last_value(clicks) OVER w, nth_value(clicks, 2) OVER w, "
        "sum(clicks) OVER (PARTITION BY country ORDER BY bucket_start ROWS 2 PRECEDING) "
        "FROM ctr WINDOW w AS (ORDER BY bucket_start) QUALIFY row_number() OVER w < 10",
        "SELECT coalesce(NULL, 1), ifnull(NULL, 1), if(true, 1, 2), CASE WHEN true THEN 1 END, "
        "typeof(1), try_cast('x' AS INT), greatest(1, 2), least(1, 2), abs(-1), round(1.5), "
        "ln(2), log10(10), pow(2, 3), sqrt(4), mod(5, 2), 7 // 2, 7 % 2, 2 ** 3, 5 !",
        "SELECT lower(source), upper(source), length(source), substr(source, 1, 2), "
        "concat(source, 'x'), source || 'x', replace(source, 'a', 'b'), trim(source), "
        "regexp_replace(source, 'a', 'b'), regexp_matches(source, 'a'), "
        "split_part(source, 'a', 1), lpad(source, 9, '.'), left(source, 1), strpos(source, 'a'), "
        "position('a' IN source), source LIKE 'b%', source ILIKE 'B%', source NOT LIKE 'x', "
        "source SIMILAR TO 'b.*', source GLOB 'b*', starts_with(source, 'b'), "
        "format('{}-{}', source, 1), printf('%s', source) FROM ctr",
        "SELECT [x * 2 FOR x IN [1, 2] IF x > 1], list_transform([1, 2], x -> x + 1), "
        "list_filter([1, 2], x -> x > 1), list_reduce([1, 2], (a, b) -> a + b), [1, 2][1], "
        "{'a': 1}.a, struct_pack(a := 1), MAP {'a': 1}, len([1]), unnest([1, 2]), "
        "'{\"a\": 1}'::JSON ->> 'a', json_extract('{\"a\": 1}', '$.a'), source.upper() FROM ctr",
        "SELECT * FROM range(3) t(x), generate_series(1, 2) u(y), unnest([1]) v(z)",
        "SELECT now() - INTERVAL 1 DAY, current_date, current_timestamp, today(), "
        "make_date(2026, 1, 1), age(TIMESTAMP '2026-01-01'), date_diff('day', DATE '2026-01-01', "
        "DATE '2026-02-01'), TIMESTAMP '2026-01-01' AT TIME ZONE 'Europe/Berlin'",
        "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
        "SELECT * FROM r",
        "SELECT * FROM ctr POSITIONAL JOIN events",
        "SELECT * FROM (PIVOT ctr ON source IN ('batch', 'speed') USING sum(clicks))",
        "EXPLAIN SELECT sum(clicks) FROM ctr",
        "SUMMARIZE SELECT lower(source) FROM ctr",
        "SELECT 18446744073709551616, 1e400, 'nan'::DOUBLE",  # constants JSON cannot spell
    ],
)
def test_the_library_an_analyst_needs_is_allowed(sql: str) -> None:
    assert check_read_only(sql) == sql


def test_every_allowed_name_is_a_duckdb_function() -> None:
    con = duckdb.connect(config={"enable_external_access": False})
    sketches.register(con)  # the sandbox's own functions (open_sandbox registers them)
    try:
        rows = con.execute(
            "SELECT function_name, function_type, schema_name FROM duckdb_functions()"
        ).fetchall()
    finally:
        con.close()
    scalar = {name for name, kind, _ in rows if not kind.startswith("table")}
    table = {name for name, kind, _ in rows if kind == "table"}
    # unnest() in a select list is the binder's own, not a catalog function.
    assert sorted(ALLOWED_FUNCTIONS - scalar) == ["unnest"]
    assert sorted(ALLOWED_TABLE_FUNCTIONS - table) == []
    # So a qualifier (pg_catalog.x, or x.f(): a method call on column x) cannot pick another.
    assert sorted({name for name, _, schema in rows if schema != "main"} & ALLOWED_FUNCTIONS) == []
    assert frozenset().union(*FUNCTION_GROUPS.values()) == ALLOWED_FUNCTIONS


@pytest.mark.parametrize("recursion_limit", [None, 100_000])
def test_too_deep_to_check_is_refused_not_a_crash(recursion_limit: int | None) -> None:
    """Whatever Python's recursion limit (a library may raise it for the whole process:
    Airflow's does, and the suite imports it before this test)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit or before)
    try:
        for deep in ("abs(" * 600 + "1" + ")" * 600, "+".join(["1"] * 500)):
            with pytest.raises(SqlRefusedError, match="nests too deeply"):
                check_read_only(f"SELECT {deep}")
        assert check_read_only("SELECT " + "abs(" * 100 + "1" + ")" * 100)
    finally:
        sys.setrecursionlimit(before)


def test_a_refused_query_never_reaches_a_worker(snapshot: LakeSnapshot) -> None:
    """Before the allow-list each of these segfaulted its worker: ten cost ten restarts."""
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20)
    try:
        for _ in range(10):
            with pytest.raises(SqlRefusedError, match=r"pandas_scan\(\) is not allowed"):
                pool.run("SELECT * FROM pandas_scan(NULL)", snapshot, client="a")
        assert pool.worker_pids() == []  # no worker was even started
        stats = pool.stats()
        assert (stats.refused, stats.queries, stats.worker_restarts) == (10, 0, 0)
        # Refusals cost nothing: no back-off.
        assert pool.run("SELECT 1", snapshot, client="a").rows == [[1]]
    finally:
        pool.close()


# -- a client whose query costs a worker waits ---------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    """Time for the pool's back-off, moved by the test (no sleeping)."""
    return FakeClock()


@pytest.fixture
def timed_pool(clock: FakeClock) -> Iterator[SqlPool]:
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=1.0, clock=clock)
    yield pool
    pool.close()


def test_backoff_pauses_double_up_to_the_cap() -> None:
    backoff = ClientBackoff(first_s=1.0, max_s=60.0, forgive_s=30.0)
    assert [backoff.pause_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.pause_s(10_000) == 60
    # A strike is forgiven per 30 s without a new one.
    assert [backoff.remaining(4, quiet) for quiet in (0, 29.9, 30, 61, 119, 120, 500)] == [
        4,
        4,
        3,
        2,
        1,
        0,
        0,
    ]
    with pytest.raises(ValueError, match="'first_s' must be > 0 and at most 'max_s' \\(1\\)"):
        ClientBackoff(first_s=2.0, max_s=1.0)
    with pytest.raises(ValueError, match="'forgive_s' must be > 0"):
        ClientBackoff(forgive_s=0)


def test_a_client_that_costs_a_worker_is_backed_off_and_no_other(
    timed_pool: SqlPool, snapshot: LakeSnapshot, clock: FakeClock
) -> None:
    pool = timed_pool
    pool.run("SELECT 1", snapshot, client="greedy")
    restarts = pool.stats().worker_restarts
    # Its worker lost (out of memory: a new process must start): two strikes, 2 s.
    with pytest.raises(SqlError, match=r"Out of Memory.*refused for the next 2 s"):
        pool.run(OUT_OF_MEMORY, snapshot, client="greedy")
    queries = pool.stats().queries
    with pytest.raises(SqlBusyError, match="cost SQL workers") as busy:
        pool.run("SELECT 1", snapshot, client="greedy")
    assert busy.value.retry_after_s == 2
    assert pool.stats().queries == queries  # answered without a worker
    assert pool.stats().backed_off == 1
    assert pool.run("SELECT 'other'", snapshot, client="polite").rows == [["other"]]
    assert pool.run("SELECT 'anonymous'", snapshot).rows == [["anonymous"]]
    assert pool.stats().worker_restarts == restarts + 1

    # A cheap query that succeeds between two costly ones resets nothing (before, it did:
    # two streams alternating a worker-killing query and SELECT 1 killed 12 workers in 75 s).
    clock.now += 2.0
    assert pool.run("SELECT 'cheap'", snapshot, client="greedy").rows == [["cheap"]]
    with pytest.raises(SqlError, match="refused for the next 8 s"):
        pool.run(OUT_OF_MEMORY, snapshot, client="greedy")
    assert pool.strikes("greedy") == 4
    clock.now += 8.0
    assert pool.run("SELECT 'cheap'", snapshot, client="greedy").rows == [["cheap"]]
    with pytest.raises(SqlError, match="refused for the next 32 s"):
        pool.run(OUT_OF_MEMORY, snapshot, client="greedy")
    # Quiet time forgives a strike per forgive_s (60 s): the pause halves with each.
    clock.now += 60.0 * 3
    assert pool.strikes("greedy") == 3
    with pytest.raises(SqlError, match="refused for the next 16 s"):
        pool.run(OUT_OF_MEMORY, snapshot, client="greedy")  # 3 + 2 strikes
    clock.now += 60.0 * 10
    assert pool.strikes("greedy") == 0
    assert pool.run("SELECT 'forgiven'", snapshot, client="greedy").rows == [["forgiven"]]


def test_a_kill_at_the_time_limit_backs_off(timed_pool: SqlPool, snapshot: LakeSnapshot) -> None:
    pool = timed_pool
    with pytest.raises(SqlError, match="time limit of 1 s; this key's queries are refused"):
        pool.run(RUNAWAY_REGEX, snapshot, timeout_s=1.0, client="runaway")
    with pytest.raises(SqlBusyError):
        pool.run("SELECT 1", snapshot, client="runaway")
    assert pool.strikes("runaway") == 2  # killed: the worker was lost
    assert pool.run("SELECT 1", snapshot, client="other").rows == [[1]]


def test_a_crashed_worker_backs_off(timed_pool: SqlPool, snapshot: LakeSnapshot) -> None:
    pool = timed_pool
    pool.run("SELECT 1", snapshot)
    crashed: list[int] = []

    def crash() -> None:
        """The worker dies by a signal while it runs the query (as pandas_scan's segfault did):
        once the query has reached it, however long that takes."""
        pids = wait_until(pool.query_pids, timeout_s=120, what="the query reached its worker")
        os.kill(pids[0], signal.SIGSEGV)
        crashed.extend(pids)

    killer = threading.Thread(target=crash, daemon=True)
    killer.start()
    with pytest.raises(SqlError, match=r"crashed \(SIGSEGV\).*refused for the next 2 s"):
        pool.run(RUNAWAY_REGEX, snapshot, timeout_s=600.0, client="crasher")
    killer.join()
    assert len(crashed) == 1
    with pytest.raises(SqlBusyError):
        pool.run("SELECT 1", snapshot, client="crasher")
    assert pool.run("SELECT 1", snapshot, client="other").rows == [[1]]


def test_a_query_stopped_at_the_time_limit_is_a_strike(
    request: pytest.FixtureRequest, snapshot: LakeSnapshot, clock: FakeClock
) -> None:
    """Stopped by DuckDB's interrupt, its worker kept: a strike all the same (before, four such
    queries at a time from one key held every worker with no back-off)."""
    # A minute's grace: the interrupt stops it first, however slow the machine (a kill after
    # the grace would cost the worker: two strikes).
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=60.0, clock=clock)
    request.addfinalizer(pool.close)
    slow = "SELECT count(*) FROM range(1000000) a, range(1000000) b WHERE a.range * b.range = -1"
    with pytest.raises(
        SqlError, match=r"time limit of 1 s; this key's queries are refused for the next 1 s$"
    ):
        pool.run(slow, snapshot, timeout_s=1.0, client="slow")
    assert pool.strikes("slow") == 1
    with pytest.raises(SqlBusyError):
        pool.run("SELECT 1", snapshot, client="slow")
    clock.now += 1.0
    with pytest.raises(SqlError, match=r"refused for the next 2 s$"):
        pool.run(slow, snapshot, timeout_s=1.0, client="slow")


def test_an_ordinary_error_costs_nothing(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    for sql in ("SELECT nope FROM ctr", "SELEC 1", "SELECT 1/0::INTEGER, 'x'::INTEGER"):
        with pytest.raises(SqlError):
            pool.run(sql, snapshot, client="clumsy")
    with pytest.raises(SqlRefusedError):
        pool.run("SELECT * FROM nope", snapshot, client="clumsy")
    assert pool.run("SELECT 1", snapshot, client="clumsy").rows == [[1]]
    assert pool.stats().backed_off == 0
    assert pool.strikes("clumsy") == 0


# -- worker directories ----------------------------------------------------------------------


def test_worker_directories_go_with_their_workers(snapshot: LakeSnapshot) -> None:
    pool = SqlPool(workers=2, queue_size=0, memory_bytes=512 * 2**20, grace_s=0.5)
    seen: set[Path] = set()

    def workdirs() -> set[Path]:
        return {Path(os.readlink(f"/proc/{pid}/cwd")) for pid in pool.worker_pids()}

    try:
        for sql in (OUT_OF_MEMORY, RUNAWAY_REGEX, OUT_OF_MEMORY):
            pool.run("SELECT 1", snapshot)
            seen |= workdirs()
            with pytest.raises(SqlError):
                pool.run(sql, snapshot, timeout_s=1.0)
            assert pool.run("SELECT 1", snapshot).rows == [[1]]
            current = workdirs()
            assert all(d.name.startswith("ctr-sql-") and d.is_dir() for d in current)
            # Only the running workers' directories exist; replaced ones are gone.
            assert [d for d in seen - current if d.exists()] == []
            seen |= current
        assert pool.stats().worker_restarts >= 3
        assert len(seen) >= 4
    finally:
        pool.close()
    assert [d for d in seen if d.exists()] == []


# -- issue 55: tables allow-listed like functions ---------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM information_schema.columns",
        "SELECT * FROM pg_catalog.pg_settings",
        "SELECT name FROM pg_settings",
        "SELECT * FROM duckdb_tables",
        "SELECT * FROM duckdb_settings",
        "FROM main.ctr",
        "FROM memory.main.ctr",
        "SELECT (SELECT count(*) FROM duckdb_views)",
        "SELECT * FROM ctr, LATERAL (SELECT * FROM duckdb_columns) c",
        "SELECT * FROM ctr UNION ALL SELECT * FROM duckdb_databases",
        "DESCRIBE information_schema.tables",
        "SUMMARIZE SELECT * FROM duckdb_tables",
        "SHOW databases",
        "EXPLAIN SELECT * FROM duckdb_tables",
        # A CTE's name is in scope in its query and in the CTEs after it, not before it nor
        # in another query: DuckDB reads these names from its catalog.
        "WITH a AS (FROM duckdb_views), duckdb_views AS (SELECT 1 x) FROM a",
        "SELECT * FROM (WITH duckdb_tables AS (SELECT 1) FROM duckdb_tables), duckdb_tables",
    ],
)
def test_catalog_tables_are_refused(sql: str) -> None:
    with pytest.raises(SqlRefusedError, match=r"the table \S+ is not allowed"):
        check_read_only(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "WITH duckdb_tables AS (SELECT 1 AS x) SELECT * FROM duckdb_tables",
        "WITH a AS (SELECT 1 AS x), b AS (FROM a) FROM b, ctr",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) FROM r",
        "SELECT * FROM (WITH x AS (SELECT 1 AS a) FROM x) t JOIN CTR USING (a)",
        "SHOW TABLES",
        "DESCRIBE ctr_v3",
        "FROM stale_v2",
    ],
)
def test_views_and_ctes_are_allowed(sql: str) -> None:
    assert check_read_only(sql) == sql


def test_a_key_names_only_its_views() -> None:
    advertiser = Access("acme", "advertiser", Scope.create(["c1"]))
    with pytest.raises(
        SqlRefusedError, match=r"the table events is not readable with an advertiser key"
    ):
        check_read_only("SELECT count(*) FROM events", advertiser)
    with pytest.raises(
        SqlRefusedError, match=r"the table drift is not readable with an advertiser"
    ):
        check_read_only("SELECT * FROM drift", advertiser)
    assert check_read_only("SELECT * FROM drift", Access("team", "analyst"))
    assert check_read_only("SELECT count(*) FROM events")  # an admin's


def test_catalog_tables_never_reach_a_worker(pool: SqlPool, snapshot: LakeSnapshot) -> None:
    """Before, an analyst read information_schema, pg_catalog.pg_settings, duckdb_tables."""
    analyst = Access("team", "analyst")
    for sql in ("SELECT * FROM pg_catalog.pg_settings", "SELECT * FROM duckdb_tables"):
        with pytest.raises(SqlRefusedError, match="is not allowed"):
            pool.run(sql, snapshot, access=analyst)
    assert pool.stats().queries == 0
