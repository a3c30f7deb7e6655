"""The API under attack by a token holder (and by strangers): the probes of issue 14 against a
real server over a real lake, each checked against the lake's bytes, not only the status."""

from __future__ import annotations

import concurrent.futures
import csv
import io
import itertools
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ByteSize, SecretStr

from access.key_store import create_key
from alerts.settings import AlertSettings
from api.main import create_app
from api.settings import ApiSettings
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from serving_layer.sandbox.pool import SqlPool
from serving_layer.snapshots import SnapshotSource
from tests.support.api_server import running_app
from tests.support.fake_clock import FakeClock
from tests.support.lake_writer import RUNAWAY_REGEX, build_sandbox_lake, lake_digest
from tests.support.waiting import wait_until

TOKEN = "attack-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 64 * 1024
# 10^12 rows: hours of one core, so it runs until its time limit or until the test kills it.
ENDLESS = "SELECT max(range % 7) FROM range(1000000000000)"
# 1 GB in one string, twice a worker's memory: DuckDB's out-of-memory error at once, and the
# worker is replaced (its address space may be fragmented): a worker lost, without a race.
OUT_OF_MEMORY = "SELECT length(repeat('x', 1000000000))"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    return build_sandbox_lake(tmp_path_factory.mktemp("attacked"))


def _settings(**overrides: Any) -> ApiSettings:
    limits: dict[str, Any] = {
        "refresh_s": 0,
        "sql_timeout_s": 2,
        "sql_workers": 2,
        "sql_queue": 2,
        "sql_memory_limit": ByteSize(512 * 2**20),
        "sql_max_bytes": ByteSize(2**20),
        "max_body_bytes": ByteSize(MAX_BODY),
        # Keys' last uses are committed when the server stops: the lake's bytes stay put.
        "key_use_flush_s": 3600,
    }
    return ApiSettings(token=SecretStr(TOKEN), **{**limits, **overrides})


@pytest.fixture(scope="module")
def clock() -> FakeClock:
    """The server's clock: a key stays backed off until a test moves it."""
    return FakeClock()


@pytest.fixture(scope="module")
def base_url(lake: LakeSettings, clock: FakeClock) -> Iterator[str]:
    settings = _settings()
    with running_app(
        create_app(settings, lake, KafkaSettings(), alert_settings=AlertSettings(), clock=clock),
        settings,
    ) as url:
        yield url


@pytest.fixture
def held(lake: LakeSettings) -> Iterator[tuple[str, FastAPI]]:
    """A server of its own whose queries have ten minutes: a query ends by itself (out of
    memory, say), or, :data:`ENDLESS`, when the test kills its worker (:func:`kill_workers`)
    once it has seen what it needs meanwhile; never at a time limit that a busy machine would
    reach first. Its URL, and its app (whose pool names its workers)."""
    settings = _settings(sql_timeout_s=600, sql_queue_timeout_s=600)
    app = create_app(settings, lake, KafkaSettings(), alert_settings=AlertSettings())
    with running_app(app, settings) as url:
        yield url, app


@pytest.fixture
def held_client(held: tuple[str, FastAPI]) -> Iterator[httpx.Client]:
    """The bootstrap admin's client of the :func:`held` server."""
    with httpx.Client(base_url=held[0], headers=AUTH, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, headers=AUTH, timeout=60) as client:
        yield client


# Limits count per key (issue 55): each test that backs a client off gets a key of its own.
_KEYS = itertools.count(1)


def key_client(base_url: str, lake: LakeSettings, role: str = "admin") -> httpx.Client:
    """A client with a new key of the lake's key store."""
    _, key = create_key(lake, f"other-{next(_KEYS)}", role)
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


@pytest.fixture
def other_client(base_url: str, lake: LakeSettings) -> Iterator[httpx.Client]:
    with key_client(base_url, lake) as client:
        yield client


def sql(client: httpx.Client, query: str) -> httpx.Response:
    return client.post("/api/v1/sql", json={"sql": query})


def metric(client: httpx.Client, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_writes_are_refused_and_the_lake_keeps_its_bytes(
    client: httpx.Client, lake: LakeSettings, tmp_path: Path
) -> None:
    before = lake_digest(lake)
    master_file = SnapshotSource(lake, refresh_s=0).current()["master/events"].files[0]
    outside = tmp_path / "out.csv"
    for attack in (
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 42 AS x",
        "EXPLAIN ANALYZE INSERT INTO covered SELECT * FROM covered",
        f"EXPLAIN ANALYZE COPY (SELECT 'x' AS pwned) TO '{master_file}' "
        "(FORMAT csv, USE_TMP_FILE false)",
        f"COPY (SELECT 'x' AS pwned) TO '{master_file}' (FORMAT csv, USE_TMP_FILE false)",
        f"EXPLAIN (ANALYZE) COPY (SELECT 1) TO '{outside}'",
        "/* /* */ SELECT */ PRAGMA version",
        f"ATTACH '{tmp_path / 'x.db'}'",
    ):
        response = sql(client, attack)
        assert response.status_code == 400, attack
        assert response.json()["parameter"] == "sql"
        assert response.json()["detail"].startswith("sql: refused:"), attack
    assert lake_digest(lake) == before
    assert list(tmp_path.iterdir()) == []
    # Everything still answers, and /metrics reports no failed part.
    assert sql(client, "SELECT count(*) FROM events").json()["rows"] == [[2]]
    assert metric(client, "ctr_table_rows", table="master/events") == 2
    assert "ctr_metrics_errors{" not in client.get("/metrics").text


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"end": "0001-01-01T00:00:00Z"}, "end"),
        ({"start": "9999-12-31T00:00:00Z", "end": "9999-12-31T23:59:30Z"}, "end"),
        # Before the year 1 in UTC: the start is what is out of range.
        ({"start": "0001-01-01T00:30:00+01:00", "end": "0001-01-02T00:00:00Z"}, "start"),
        ({"start": "0001-01-01T00:30:00+01:00", "end": "2026-01-02T00:00:00Z"}, "start"),
        ({"start": "1969-12-31T23:59:00Z", "end": "1970-01-01T01:00:00Z"}, "start"),
        ({"end": "9999-12-31T23:59:59.999999-23:59"}, "end"),
        ({"limit": "-1"}, "limit"),
        ({"limit": str(2**64)}, "limit"),
        ({"limit": "0"}, "limit"),
    ],
)
def test_times_and_numbers_at_the_edges_are_400s(
    client: httpx.Client, params: dict[str, str], parameter: str
) -> None:
    response = client.get("/api/v1/ctr", params=params)
    assert response.status_code == 400
    assert response.json()["parameter"] == parameter


def test_the_earliest_and_latest_times_answer(client: httpx.Client) -> None:
    for params in (
        {"start": "1970-01-01T00:00:00Z", "end": "1970-01-02T00:00:00Z"},
        {"end": "1970-01-01T00:00:00Z"},  # the default range would start before 1970
        {"start": "9998-12-31T00:00:00Z", "end": "9999-01-01T00:00:00Z"},
    ):
        response = client.get("/api/v1/ctr", params={**params, "granularity": "day"})
        assert response.status_code in (200, 400), params
        if response.status_code == 400:
            assert response.json()["parameter"] == "end"  # end <= start after rounding
        else:
            assert response.json()["rows"] == []


def raw_request(base_url: str, head: str) -> bytes:
    """Send only a request head (no body) and read the answer until the server closes."""
    parts = urlsplit(base_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as conn:
        conn.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_strangers_get_401_before_their_body_is_read(base_url: str) -> None:
    # A 10 MB body is announced and never sent: the answer comes without waiting for it.
    answer = raw_request(
        base_url,
        "POST /api/v1/sql HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        "Content-Length: 10000000\n",
    )
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"www-authenticate: Bearer" in answer
    malformed = httpx.post(
        f"{base_url}/api/v1/sql", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert (malformed.status_code, malformed.headers["www-authenticate"]) == (401, "Bearer")


def test_large_bodies_get_413_before_they_are_read(base_url: str, client: httpx.Client) -> None:
    answer = raw_request(
        base_url,
        f"POST /api/v1/sql HTTP/1.1\nHost: x\nAuthorization: Bearer {TOKEN}\n"
        "Content-Type: application/json\nContent-Length: 10000000\n",
    )
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"API_MAX_BODY_BYTES" in answer

    def chunked() -> Iterator[bytes]:
        yield b'{"sql": "SELECT 1 '
        for _ in range(100):
            yield b" " * 1024
        yield b'"}'

    response = client.post(
        "/api/v1/sql", content=chunked(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    small = client.post(
        "/api/v1/sql",
        content=iter([b'{"sql": ', b'"SELECT 7"}']),
        headers={"Content-Type": "application/json"},
    )
    assert small.json()["rows"] == [[7]]


def test_answers_are_capped_in_bytes(client: httpx.Client) -> None:
    response = client.post(
        "/api/v1/sql", json={"sql": "SELECT repeat('x', 10000) FROM range(1000)"}
    )
    body = response.json()
    assert (body["truncated"], body["truncated_by"]) == (True, "max_bytes")
    assert len(body["rows"]) == 104  # rows of 10,005 JSON bytes within 1 MiB
    assert len(response.content) < 2**20 + 4096


def test_the_openapi_document_declares_the_limits(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    limit = next(
        p for p in schema["paths"]["/api/v1/ctr"]["get"]["parameters"] if p["name"] == "limit"
    )
    assert {"type": "integer", "minimum": 1} in limit["schema"]["anyOf"]
    sql_schema = schema["components"]["schemas"]["SqlRequest"]["properties"]["sql"]
    assert (sql_schema["minLength"], sql_schema["maxLength"]) == (1, 100_000)
    assert {"400", "401", "413", "429", "503"} <= set(
        schema["paths"]["/api/v1/sql"]["post"]["responses"]
    )


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_heavy_queries_do_not_take_the_servers_memory(
    held: tuple[str, FastAPI], lake: LakeSettings
) -> None:
    """Before the worker pool, four of these took the API process to 4 GB."""
    # Four keys (one key's share is a worker and a place in the queue); each is backed off
    # after its query ran out of memory. No time limit comes first, however slow the machine.
    url, _ = held
    clients = [key_client(url, lake) for _ in range(4)]
    baseline = rss_mb()
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):  # a sample every 20 ms until the queries are answered
            peak = max(peak, rss_mb())

    sampler = threading.Thread(target=sample)
    sampler.start()
    heavy = "SELECT max(length(repeat('x', 100000000 + range::INT))) FROM range(8)"
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda c: sql(c, heavy), clients))
    finally:
        done.set()
        sampler.join()
        for client in clients:
            client.close()
    for response in responses:
        assert response.status_code == 400
        assert "Out of Memory" in response.json()["detail"]
    # The test process holds the API server: 800 MB per query went to the workers, not here.
    assert peak - baseline < 200


def running_queries(app: FastAPI, client: httpx.Client, running: int, queued: int) -> list[int]:
    """Once ``running`` queries have reached their workers and ``queued`` more wait: the
    process ids of those workers (ending one ends its query, whatever its speed)."""
    pool: SqlPool = app.state.sql_pool

    def reached() -> list[int] | None:
        pids = pool.query_pids()
        return pids if len(pids) == running and metric(client, "ctr_sql_queued") == queued else None

    return wait_until(reached, timeout_s=120, what=f"{running} queries running, {queued} queued")


def kill_workers(pids: list[int]) -> None:
    """End the queries running in these workers: their worker processes die (SIGKILL)."""
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def test_one_key_cannot_take_every_worker(
    held: tuple[str, FastAPI], held_client: httpx.Client, lake: LakeSettings
) -> None:
    """Issue 55: four queries at a time from one key, each stopped at the time limit, held every
    worker (another client's SELECT 42: p50 19.7 s). Now a key holds its share: one worker and
    one place in the queue; another key finds a worker at once."""
    url, app = held
    with (
        key_client(url, lake) as attacker,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        runaway = [pool.submit(sql, attacker, ENDLESS) for _ in range(4)]
        attackers_worker = running_queries(app, held_client, running=1, queued=1)
        other = sql(held_client, "SELECT 42")
        # Answered while the attacker's queries held their share (they run until killed).
        saturated = not all(f.done() for f in runaway)
        kill_workers(attackers_worker)
        answers = sorted((f.result() for f in runaway), key=lambda r: r.status_code)
    assert saturated, "the attacker's queries ended before the other key's answer"
    assert other.json()["rows"] == [[42]]
    # The key's share: one ran (and lost its worker), one waited (then found the key backed
    # off), two were refused at once.
    assert [a.status_code for a in answers] == [400, 429, 429, 429]
    assert "the query's worker process ended" in answers[0].json()["detail"]
    details = " ".join(a.json()["detail"] for a in answers[1:])
    assert "API_SQL_WORKERS_PER_KEY" in details
    assert "cost SQL workers" in details


def test_the_api_answers_while_every_worker_is_busy(
    held: tuple[str, FastAPI], held_client: httpx.Client, lake: LakeSettings
) -> None:
    url, app = held
    client = held_client
    restarts = metric(client, "ctr_sql_worker_restarts_total") or 0
    attackers = [key_client(url, lake) for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # Two keys, each its share: every worker and every place in the queue.
        runaway = [pool.submit(sql, a, ENDLESS) for a in attackers for _ in range(2)]
        workers = running_queries(app, client, running=2, queued=2)
        health = client.get("/healthz")
        ctr = client.get(
            "/api/v1/ctr", params={"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T11:00:00Z"}
        )
        busy = sql(client, "SELECT 1")
        # Every answer above came while the runaway queries held the pool: they end only now.
        saturated = not any(f.done() for f in runaway)
        kill_workers(workers)
        answers = [f.result() for f in runaway]
    for attacker in attackers:
        attacker.close()
    assert saturated, "the pool emptied before the other requests were answered"
    assert (health.status_code, ctr.status_code) == (200, 200)
    assert ctr.json()["rows"][0]["impressions"] == 10 + 30  # batch minute 0, speed minute 1
    assert busy.status_code == 429
    assert busy.headers["retry-after"] == "1"
    assert "too many SQL queries" in busy.json()["detail"]
    # Each key's first query lost its worker; its second found the key backed off.
    assert sorted(a.status_code for a in answers) == [400, 400, 429, 429]
    for answer in answers:
        if answer.status_code == 400:
            assert "the query's worker process ended" in answer.json()["detail"]
        else:
            assert "cost SQL workers" in answer.json()["detail"]
    assert sql(client, "SELECT 'after'").json()["rows"] == [["after"]]
    # Killed workers are replaced when next needed: at least the one 'after' ran in.
    assert (metric(client, "ctr_sql_worker_restarts_total") or 0) >= restarts + 1


# -- issue 32: the SQL endpoint, second round ----------------------------------------------------


def test_functions_off_the_allow_list_never_reach_a_worker(client: httpx.Client) -> None:
    """pandas_scan(NULL) segfaulted a worker: ten in a row cost ~52 s of restarts."""
    restarts = metric(client, "ctr_sql_worker_restarts_total")
    for _ in range(10):
        response = sql(client, "SELECT * FROM pandas_scan(NULL)")
        assert response.status_code == 400
        assert response.json()["detail"].startswith(
            "sql: refused: the table function pandas_scan() is not allowed"
        )
    assert metric(client, "ctr_sql_worker_restarts_total") == restarts
    for function, query in (
        ("getenv", "SELECT getenv('HOME')"),
        ("current_setting", "SELECT (SELECT current_setting('threads'))"),
        ("query", "FROM query('SELECT 1')"),
        ("duckdb_settings", "SELECT * FROM duckdb_settings()"),
    ):
        detail = sql(client, query).json()["detail"]
        assert f"function {function}() is not allowed" in detail
    # Refusals cost no worker: the client is not backed off.
    assert sql(client, "SELECT 1").json()["rows"] == [[1]]


def test_the_allowed_functions_are_listed(client: httpx.Client, base_url: str) -> None:
    body = client.get("/api/v1/sql/functions").json()
    assert body["table_functions"] == ["generate_series", "range", "unnest"]
    functions = body["functions"]
    assert {"count", "sum", "quantile_cont", "string_agg"} <= set(functions["aggregates"])
    assert {"row_number", "lag", "ntile"} <= set(functions["windows"])
    assert {"date_trunc", "strftime", "time_bucket"} <= set(functions["time"])
    assert {"+", "||", "~~"} <= set(functions["operators"])
    listed = {name for names in functions.values() for name in names}
    assert not {"pandas_scan", "getenv", "current_setting", "query", "read_csv"} & listed
    assert httpx.get(f"{base_url}/api/v1/sql/functions").status_code == 401


def test_a_client_whose_query_kills_its_worker_is_backed_off(
    client: httpx.Client,
    other_client: httpx.Client,
    base_url: str,
    lake: LakeSettings,
    clock: FakeClock,
) -> None:
    restarts = metric(client, "ctr_sql_worker_restarts_total") or 0
    killed = sql(other_client, OUT_OF_MEMORY)
    assert killed.status_code == 400
    assert "Out of Memory" in killed.json()["detail"]
    # A worker lost: two strikes, 2 s.
    assert "refused for the next 2 s" in killed.json()["detail"]
    ran = metric(client, "ctr_sql_queries_total", outcome="run")
    busy = sql(other_client, "SELECT 1")
    assert busy.status_code == 429
    assert busy.headers["retry-after"] == "2"  # the server's clock has not moved
    assert "cost SQL workers" in busy.json()["detail"]
    assert metric(client, "ctr_sql_queries_total", outcome="run") == ran  # no worker asked
    # Others are not affected: another key, and the same address with another key.
    assert sql(client, "SELECT 'other'").json()["rows"] == [["other"]]
    with key_client(base_url, lake, "analyst") as analyst:
        assert sql(analyst, "SELECT 'analyst'").json()["rows"] == [["analyst"]]
    # The worker was replaced: a new process answered one of these.
    assert (metric(client, "ctr_sql_worker_restarts_total") or 0) >= restarts + 1
    clock.now += 2.1
    # A cheap success does not reset the back-off (issue 55: it did, and two streams of
    # worker-killing queries killed 12 workers in 75 s): the next kill costs 8 s.
    assert sql(other_client, "SELECT 'again'").json()["rows"] == [["again"]]
    again = sql(other_client, RUNAWAY_REGEX)
    assert "stopped at the time limit of 2 s" in again.json()["detail"]
    assert "refused for the next 8 s" in again.json()["detail"]


@pytest.mark.parametrize(
    ("as_of", "detail"),
    [
        ("0001-01-01T00:00:00+14:00", "out of range"),
        ("9999-12-31T23:59:59-14:00", "out of range"),
        ("0001-01-01T00:00:00Z", "before the lake's first commit"),
        ("9999-12-31T23:59:59Z", "in the future"),
    ],
)
def test_as_of_at_the_edges_is_a_400(client: httpx.Client, as_of: str, detail: str) -> None:
    response = client.post("/api/v1/sql", json={"sql": "SELECT 1", "as_of": as_of})
    assert response.status_code == 400
    assert response.json()["parameter"] == "as_of"
    assert detail in response.json()["detail"]


@pytest.mark.parametrize(
    "query",
    [
        "SELECT {'中': 1} AS s, 1.5::DECIMAL(4, 2) AS d",
        "SELECT 'a'::ENUM(E'x\\r\\ny', 'a') AS e",
        "SELECT 'a'::ENUM(E'\\t\\x01%,\\x7f', 'a') AS e, 'é' AS \"é\"",
    ],
)
def test_csv_headers_carry_any_type_name(client: httpx.Client, query: str) -> None:
    types = client.post("/api/v1/sql", json={"sql": query}).json()["types"]
    response = client.post("/api/v1/sql", params={"format": "csv"}, json={"sql": query})
    assert response.status_code == 200
    header = response.headers["ctr-column-types"]
    assert header.isascii()
    assert header.isprintable()  # no CR, LF or other control character
    assert [unquote(t) for t in header.split(",")] == types


def test_csv_quotes_column_names_with_line_breaks(client: httpx.Client) -> None:
    response = client.post(
        "/api/v1/sql", params={"format": "csv"}, json={"sql": 'SELECT 1 AS "a\r\nb", 2 AS "c\nd"'}
    )
    assert response.text == '"a\r\nb","c\nd"\r\n1,2\r\n'
    assert list(csv.reader(io.StringIO(response.text, newline=""))) == [
        ["a\r\nb", "c\nd"],
        ["1", "2"],
    ]
