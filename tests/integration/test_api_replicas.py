"""Two API replicas (``ctr serve`` processes) over one lake behind HAProxy (infra/balancer.py),
all real processes: both answer through the balancer, each seeing the client's address and not
one the client forged; at the same lake versions they answer byte for byte alike; a revoked key
is refused by both within 5 s; a key backed off through the balancer is refused by both (their
shared limits store, API_LIMITS_URL, a private PostgreSQL); the balancer caps one client's
connections; and with one replica gone the balancer answers from the other.

The last test stops a replica: the tests share the module's replicas and run in file order.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from access.key_store import create_key, revoke_key
from infra.balancer import Balancer, BalancerConfig, BalancerError, haproxy_binary
from infra.broker import free_port
from infra.private_postgres import PostgresUnavailableError, private_postgres
from infra.replicas import ApiReplicas
from lake.settings import LakeSettings
from tests.support.lake_writer import cover, ctr_row, minute, write_batch, write_speed
from tests.support.lakes import new_lake
from tests.support.waiting import wait_until

TOKEN = "replicas-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RANGE = {"start": minute(0).isoformat(), "end": minute(90).isoformat()}
PER_CLIENT = 4  # connections one client may hold at the balancer
# A client on another loopback address than the balancer's (127.0.0.1), so that the address the
# replicas see tells the two apart.
CLIENT_ADDRESS = "127.0.0.2"
# 1 GB in one string, twice a SQL worker's memory: DuckDB's out-of-memory error at once, the
# worker lost (two strikes).
OUT_OF_MEMORY = "SELECT length(repeat('x', 1000000000))"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    lake = new_lake(tmp_path_factory.mktemp("replicas-lake"))
    write_batch(
        lake,
        "run-a",
        [ctr_row(minute(5), 100, 10, campaign="c1"), ctr_row(minute(6), 50, 1, campaign="c2")],
    )
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(
        lake,
        [ctr_row(minute(45), 40, 4, campaign="c1"), ctr_row(minute(70), 20, 2, campaign="c2")],
    )
    return lake


@pytest.fixture(scope="module")
def run_dir() -> Iterator[Path]:
    """Short enough for HAProxy's stats socket (a pytest folder may not be)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ctr-replicas-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def limits_url() -> Iterator[str]:
    try:
        with private_postgres(os.environ) as url:
            yield url.get_secret_value()
    except PostgresUnavailableError as exc:
        pytest.skip(f"no PostgreSQL for the limits store: {exc}")


@pytest.fixture(scope="module")
def replicas(lake: LakeSettings, run_dir: Path, limits_url: str) -> Iterator[ApiReplicas]:
    try:
        haproxy_binary()
    except BalancerError as exc:
        pytest.skip(str(exc))
    environ = {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "API_TOKEN": TOKEN,
        "API_TRUSTED_PROXIES": "127.0.0.1",
        "API_LIMITS_URL": limits_url,
        # A worker's memory below the query that exhausts it (OUT_OF_MEMORY), and a back-off of
        # minutes: refused on the other replica however slow the machine.
        "API_SQL_MEMORY_LIMIT": "512MiB",
        "API_SQL_BACKOFF_S": "300",
        "API_SQL_MAX_BACKOFF_S": "600",
    }
    with ApiReplicas(2, environ, run_dir) as started:
        yield started


@pytest.fixture(scope="module")
def balancer(replicas: ApiReplicas, run_dir: Path) -> Iterator[Balancer]:
    config = BalancerConfig(
        port=free_port(),
        replicas=replicas.replicas,
        max_connections_per_client=PER_CLIENT,
        check_interval_s=0.5,
    )
    with Balancer(config, run_dir) as started:
        started.wait_until_up()
        yield started


def _client(base_url: str, **headers: str) -> httpx.Client:
    """A client from CLIENT_ADDRESS, a new connection per request (round robin is per
    connection)."""
    transport = httpx.HTTPTransport(
        local_address=CLIENT_ADDRESS, limits=httpx.Limits(max_keepalive_connections=0)
    )
    return httpx.Client(base_url=base_url, headers=headers, transport=transport, timeout=30)


def test_both_replicas_answer_through_the_balancer(balancer: Balancer) -> None:
    before = {name: state.responses["2xx"] for name, state in balancer.replicas().items()}
    with _client(balancer.url, **AUTH) as client:
        statuses = [client.get("/api/v1/ctr", params=RANGE).status_code for _ in range(10)]
    after = {name: state.responses["2xx"] for name, state in balancer.replicas().items()}
    assert statuses == [200] * 10
    answered = {name: after[name] - before[name] for name in after}
    assert answered == {"api-1": 5, "api-2": 5}  # round robin


def test_the_replicas_see_the_client_not_the_balancer_nor_a_forged_address(
    balancer: Balancer, run_dir: Path
) -> None:
    with _client(balancer.url, **AUTH, **{"X-Forwarded-For": "203.0.113.9"}) as client:
        for _ in range(2):  # one request on each replica
            assert client.get("/api/v1/views").status_code == 200
    logged = [
        line
        for name in ("api-1", "api-2")
        for line in (run_dir / f"{name}.log").read_text().splitlines()
        if "GET /api/v1/views" in line
    ]
    assert [line.rsplit(" ", 1)[1] for line in logged] == [f"client={CLIENT_ADDRESS}"] * 2


def test_replicas_at_the_same_versions_answer_byte_for_byte_alike(
    replicas: ApiReplicas,
) -> None:
    params = {**RANGE, "granularity": "minute", "group_by": "campaign_id"}
    answers = [
        httpx.get(f"{replicas.url(name)}/api/v1/ctr", params=params, headers=AUTH, timeout=30)
        for name in ("api-1", "api-2")
    ]
    assert [answer.status_code for answer in answers] == [200, 200]
    first, second = (answer.json() for answer in answers)
    assert first["freshness"]["versions"] == second["freshness"]["versions"]
    assert [row["clicks"] for row in first["rows"]] == [10, 1, 4, 2]
    assert answers[0].content == answers[1].content


def test_a_revoked_key_is_refused_by_both_replicas_within_5_s(
    lake: LakeSettings, replicas: ApiReplicas, balancer: Balancer
) -> None:
    _, key = create_key(lake, "replicas-revoked", "analyst")
    urls = [balancer.url, replicas.url("api-1"), replicas.url("api-2")]

    def statuses() -> list[int]:
        with _client("http://unused", Authorization=f"Bearer {key}") as client:
            return [client.get(f"{url}/api/v1/views").status_code for url in urls]

    assert wait_until(
        lambda: statuses() == [200, 200, 200], timeout_s=30, what="the new key is served"
    )
    revoke_key(lake, "replicas-revoked")
    # The bound: refused everywhere within 5 s of the revoke's commit.
    refused = wait_until(
        lambda: statuses() == [401, 401, 401], timeout_s=5, what="both replicas refuse the key"
    )
    assert refused


def test_a_key_backed_off_through_the_balancer_is_refused_by_both_replicas(
    lake: LakeSettings, replicas: ApiReplicas, balancer: Balancer
) -> None:
    _, key = create_key(lake, "replicas-runaway", "admin")
    runaway = {"Authorization": f"Bearer {key}"}
    wait_until(
        lambda: all(
            httpx.get(f"{replicas.url(name)}/api/v1/views", headers=runaway).status_code == 200
            for name in ("api-1", "api-2")
        ),
        timeout_s=30,
        what="both replicas know the new key",
    )
    with _client(balancer.url, **runaway) as client:
        killed = client.post("/api/v1/sql", json={"sql": OUT_OF_MEMORY})
    assert killed.status_code == 400, killed.text
    assert "refused for the next" in killed.json()["detail"]
    for name in ("api-1", "api-2"):  # whichever replica the balancer chose, both refuse it
        refused = httpx.post(
            f"{replicas.url(name)}/api/v1/sql", json={"sql": "SELECT 1"}, headers=runaway
        )
        assert refused.status_code == 429, (name, refused.text)
        assert "cost SQL workers" in refused.json()["detail"]
        # The API token's key is served by both meanwhile.
        served = httpx.post(
            f"{replicas.url(name)}/api/v1/sql", json={"sql": "SELECT 2"}, headers=AUTH
        )
        assert served.json()["rows"] == [[2]], (name, served.text)


def test_the_balancer_caps_one_clients_connections(balancer: Balancer) -> None:
    held = []
    try:
        for _ in range(PER_CLIENT + 1):
            sock = socket.create_connection(("127.0.0.1", balancer.config.port), timeout=10)
            held.append(sock)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head and (data := sock.recv(65536)):
                head += data
            status = int(head.split(b" ", 2)[1])
            assert status == (429 if len(held) > PER_CLIENT else 200), head
    finally:
        for sock in held:
            sock.close()


def test_with_one_replica_gone_the_balancer_answers_from_the_other(
    replicas: ApiReplicas, balancer: Balancer
) -> None:
    replicas.kill("api-2")
    with _client(balancer.url, **AUTH) as client:
        # At once (requests refused by api-2 go to api-1), and after the balancer's checks
        # took api-2 out.
        assert [client.get("/api/v1/ctr", params=RANGE).status_code for _ in range(6)] == [200] * 6
        wait_until(
            lambda: balancer.replicas()["api-2"].status == "DOWN",
            timeout_s=30,
            what="the balancer's checks took api-2 out",
        )
        assert [client.get("/api/v1/ctr", params=RANGE).status_code for _ in range(6)] == [200] * 6
    assert balancer.replicas()["api-1"].status == "UP"
