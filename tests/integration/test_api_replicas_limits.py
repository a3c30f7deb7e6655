"""Limits that hold across the API's replicas (issue 68): two API servers over one lake, each
counting in one real PostgreSQL (a private cluster, `infra/postgres.sh`): a key backed off on
replica A is refused on replica B, a key at its share on A is refused on B, and keys' last uses
from both reach the key store in one commit per flush interval. The store itself first: leases
counted under a lock of the key's whoever asks, a crashed replica's leases lapsing, the back-off
timed by the database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg2
import pytest
from fastapi import FastAPI
from pydantic import ByteSize, SecretStr

from access.key_ring import ApiKey, KeyRing
from access.key_store import create_key, read_keys
from alerts.settings import AlertSettings
from api.limits import PostgresLimits
from api.limits.postgres import APPLICATION_NAME, LEASE_MARGIN_S, SCHEMA
from api.main import create_app
from api.query_gate import QueryGate
from api.settings import ApiSettings
from infra.private_postgres import PostgresUnavailableError, private_postgres
from lake.catalog import API_KEYS
from lake.settings import LakeSettings
from lake.storage import open_delta
from runtime.kafka_settings import KafkaSettings
from serving_layer.sandbox.backoff import ClientBackoff
from tests.support.api_server import running_app
from tests.support.fake_clock import FakeClock
from tests.support.lake_writer import build_sandbox_lake, minute
from tests.support.waiting import wait_until

TOKEN = "replicas-limits-token-0123456789"
# 1 GB in one string, twice a worker's memory: DuckDB's out-of-memory error at once, a worker
# lost (two strikes), without a race.
OUT_OF_MEMORY = "SELECT length(repeat('x', 1000000000))"


@pytest.fixture(scope="module")
def limits_url() -> Iterator[SecretStr]:
    try:
        with private_postgres(os.environ) as url:
            yield url
    except PostgresUnavailableError as exc:
        pytest.skip(f"no PostgreSQL for the limits store: {exc}")


def _store(url: SecretStr) -> PostgresLimits:
    """One replica's connection to the store; its keys' uses pushed every 0.1 s."""
    return PostgresLimits(url, push_s=0.1)


@pytest.fixture
def replicas(limits_url: SecretStr) -> Iterator[tuple[PostgresLimits, PostgresLimits]]:
    a, b = _store(limits_url), _store(limits_url)
    yield a, b
    a.close()
    b.close()


def _sql(url: SecretStr, statement: str, parameters: Any = None) -> list[tuple[Any, ...]]:
    """A statement of the test's own on the store's database (what a moved clock would do)."""
    connection = psycopg2.connect(url.get_secret_value())
    try:
        with connection, connection.cursor() as cursor:  # a transaction, committed
            cursor.execute(statement, parameters)
            return list(cursor.fetchall()) if cursor.description else []
    finally:
        connection.close()


def test_a_keys_share_is_counted_for_every_replica(
    replicas: tuple[PostgresLimits, PostgresLimits],
) -> None:
    on_a, on_b = (store.shares("ctr", longest_s=10) for store in replicas)
    held = [on_a.take("key:share", 2), on_b.take("key:share", 2)]
    assert None not in held
    assert on_a.take("key:share", 2) is None
    assert on_b.take("key:share", 2) is None
    assert on_b.take("key:other", 2) is not None  # other keys are not affected
    assert replicas[0].shares("sql", longest_s=10).take("key:share", 2) is not None
    lease = held.pop()
    assert lease is not None
    on_b.give_back(lease)
    assert on_a.take("key:share", 2) is not None


def test_leases_taken_at_once_on_both_replicas_never_exceed_the_share(
    replicas: tuple[PostgresLimits, PostgresLimits],
) -> None:
    shares = [store.shares("sql", longest_s=10) for store in replicas]
    start = threading.Barrier(16)

    def take(n: int) -> bool:
        start.wait()
        return shares[n % 2].take("key:crowd", 3) is not None

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        granted = list(pool.map(take, range(16)))
    assert granted.count(True) == 3


def test_a_crashed_replicas_leases_lapse(limits_url: SecretStr) -> None:
    crashed = _store(limits_url)
    # Leases that lapse as soon as they are taken: a replica that never gives them back.
    lapsing = crashed.shares("ctr", longest_s=-LEASE_MARGIN_S)
    assert lapsing.take("key:crashed", 1) is not None
    crashed.close()
    survivor = _store(limits_url)
    try:
        assert survivor.shares("ctr", longest_s=10).take("key:crashed", 1) is not None
    finally:
        survivor.close()


def test_a_connection_the_server_dropped_is_replaced_not_a_refusal(limits_url: SecretStr) -> None:
    store = _store(limits_url)
    try:
        shares = store.shares("ctr", longest_s=10)
        lease = shares.take("key:dropped", 5)
        assert lease is not None
        shares.give_back(lease)  # its connection back in the pool
        # The server ends it (a restart would end them all), and it is gone.
        ours = f"application_name = '{APPLICATION_NAME}' AND pid <> pg_backend_pid()"
        _sql(limits_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {ours}")
        wait_until(
            lambda: not _sql(limits_url, f"SELECT pid FROM pg_stat_activity WHERE {ours}"),
            timeout_s=30,
            what="the store's connection ended",
        )
        assert shares.take("key:dropped", 5) is not None
    finally:
        store.close()


def test_the_back_off_is_kept_for_every_replica_by_the_databases_clock(
    replicas: tuple[PostgresLimits, PostgresLimits],
) -> None:
    policy = ClientBackoff(first_s=300, max_s=3600, forgive_s=3600)
    on_a, on_b = (store.backoffs(policy, FakeClock()) for store in replicas)
    assert on_b.wait_s("key:striker") == 0
    assert on_a.strike("key:striker", 1) == 300
    assert 0 < on_b.wait_s("key:striker") <= 300
    assert on_b.strikes("key:striker") == 1
    # The strike on B finds A's: two strikes, the pause doubled.
    assert on_b.strike("key:striker", 1) == 600
    assert on_a.strikes("key:striker") == 2
    assert on_a.wait_s("key:other") == 0


# -- two API servers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    return build_sandbox_lake(tmp_path_factory.mktemp("replicas"))


def _settings(limits_url: SecretStr) -> ApiSettings:
    return ApiSettings(
        token=SecretStr(TOKEN),
        refresh_s=0,
        limits_url=limits_url,
        sql_workers=2,
        sql_memory_limit=ByteSize(512 * 2**20),
        # Backed off for minutes: refused on the other replica however slow the machine.
        sql_backoff_s=300,
        sql_max_backoff_s=600,
        ctr_workers_per_key=1,
        # Keys' uses committed when the last commit is an hour old (the test moves it).
        key_use_flush_s=3600,
    )


@contextlib.contextmanager
def _replica(lake: LakeSettings, limits_url: SecretStr) -> Iterator[tuple[str, FastAPI]]:
    store = _store(limits_url)
    settings = _settings(limits_url)
    app = create_app(settings, lake, KafkaSettings(), alert_settings=AlertSettings(), limits=store)
    try:
        with running_app(app, settings) as url:
            yield url, app
    finally:
        store.close()


@pytest.fixture(scope="module")
def two_replicas(
    lake: LakeSettings, limits_url: SecretStr
) -> Iterator[tuple[tuple[str, FastAPI], tuple[str, FastAPI]]]:
    # Nothing due to be committed until the test says so.
    store = _store(limits_url)
    store.check()
    store.close()
    _sql(
        limits_url,
        f"INSERT INTO {SCHEMA}.key_use_commits (committed_at) VALUES (clock_timestamp()) "
        "ON CONFLICT (one) DO UPDATE SET committed_at = excluded.committed_at",
    )
    with _replica(lake, limits_url) as a, _replica(lake, limits_url) as b:
        yield a, b


def _client(url: str, lake: LakeSettings, name: str) -> httpx.Client:
    """A client with a new key of the lake's key store, named ``name``."""
    _, key = create_key(lake, name, "admin")
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_a_key_backed_off_on_one_replica_is_refused_on_the_other(
    two_replicas: tuple[tuple[str, FastAPI], tuple[str, FastAPI]], lake: LakeSettings
) -> None:
    (url_a, _), (url_b, _) = two_replicas
    with _client(url_a, lake, "runaway") as on_a, _client(url_a, lake, "calm") as calm:
        on_b = httpx.Client(base_url=url_b, headers=on_a.headers, timeout=60)
        killed = on_a.post("/api/v1/sql", json={"sql": OUT_OF_MEMORY})
        assert killed.status_code == 400
        assert "refused for the next 600 s" in killed.json()["detail"]  # two strikes
        refused = on_b.post("/api/v1/sql", json={"sql": "SELECT 1"})
        assert refused.status_code == 429
        assert "cost SQL workers" in refused.json()["detail"]
        assert 1 <= int(refused.headers["retry-after"]) <= 600
        # Another key is served by both.
        for url in (url_a, url_b):
            answer = httpx.post(
                f"{url}/api/v1/sql", json={"sql": "SELECT 2"}, headers=calm.headers, timeout=60
            )
            assert answer.json()["rows"] == [[2]]
        on_b.close()


@contextlib.contextmanager
def _holding_a_place(gate: QueryGate, app: FastAPI, client: str) -> Iterator[None]:
    """A place of ``client``'s at ``gate`` (its share counted in the store) for the block:
    a computation on that replica that overlaps every request sent meanwhile."""
    loop: asyncio.AbstractEventLoop = app.state.server_loop
    held = threading.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.place(client):
            held.set()
            await release.wait()

    holder = asyncio.run_coroutine_threadsafe(hold(), loop)
    assert held.wait(60), holder
    try:
        yield
    finally:
        loop.call_soon_threadsafe(release.set)
        holder.result(timeout=60)


def test_a_key_at_its_share_on_one_replica_is_refused_on_the_other(
    two_replicas: tuple[tuple[str, FastAPI], tuple[str, FastAPI]], lake: LakeSettings
) -> None:
    (_, app_a), (url_b, _) = two_replicas
    query = {"start": minute(0).isoformat(), "end": minute(2).isoformat()}
    with _client(url_b, lake, "busy") as on_b:
        with _holding_a_place(app_a.state.ctr_gate, app_a, "key:busy"):
            refused = on_b.get("/api/v1/ctr", params=query)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["detail"] == (
                "this key has 1 CTR queries running across the API's replicas, its share "
                "(API_CTR_WORKERS_PER_KEY); try again when one has answered"
            )
        with _holding_a_place(app_a.state.sql_gate, app_a, "key:busy"):
            refused = on_b.post("/api/v1/sql", json={"sql": "SELECT 1"})
            assert refused.status_code == 429
            assert "running across the API's replicas" in refused.json()["detail"]
            assert "API_SQL_WORKERS_PER_KEY" in refused.json()["detail"]
        # Given back: served.
        assert on_b.get("/api/v1/ctr", params=query).status_code == 200
        assert on_b.post("/api/v1/sql", json={"sql": "SELECT 1"}).json()["rows"] == [[1]]


def _key_store_version(lake: LakeSettings) -> int:
    return open_delta(API_KEYS.path(lake), lake.object_store).version()


def test_last_uses_from_both_replicas_reach_the_key_store_in_one_commit(
    two_replicas: tuple[tuple[str, FastAPI], tuple[str, FastAPI]],
    lake: LakeSettings,
    limits_url: SecretStr,
) -> None:
    (url_a, _), (url_b, _) = two_replicas
    with _client(url_a, lake, "user-a") as on_a, _client(url_b, lake, "user-b") as on_b:
        assert on_a.get("/api/v1/views").status_code == 200
        assert on_b.get("/api/v1/views").status_code == 200
        b_headers = on_b.headers

    def pending() -> set[str]:
        """The keys whose latest use in the store is not committed to the key store yet."""
        rows = _sql(
            limits_url,
            f"SELECT name FROM {SCHEMA}.key_uses "
            "WHERE committed_use IS NULL OR used_at > committed_use",
        )
        return {row[0] for row in rows}

    def last_uses() -> dict[str, dt.datetime | None]:
        ring = read_keys(lake)
        return {name: _key(ring, name).last_used_at for name in ("user-a", "user-b")}

    wait_until(lambda: {"user-a", "user-b"} <= pending(), timeout_s=60, what="both uses kept")
    # Not due (the last commit is not an hour old): nothing committed, however many rounds.
    assert last_uses() == {"user-a": None, "user-b": None}
    version = _key_store_version(lake)
    _sql(
        limits_url,
        f"UPDATE {SCHEMA}.key_use_commits SET committed_at = committed_at - interval '2 hours'",
    )
    wait_until(lambda: None not in last_uses().values(), timeout_s=60, what="uses committed")
    assert _key_store_version(lake) == version + 1  # one commit for both replicas
    assert pending() == set()

    # A use after it is kept in the store, not committed: the next commit is an hour away.
    with httpx.Client(base_url=url_b, headers=b_headers, timeout=60) as again:
        assert again.get("/api/v1/views").status_code == 200
    wait_until(lambda: "user-b" in pending(), timeout_s=60, what="the new use kept")
    assert _key_store_version(lake) == version + 1


def _key(ring: KeyRing, name: str) -> ApiKey:
    key = ring.get(name)
    assert key is not None, name
    return key
