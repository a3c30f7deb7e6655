"""/api/v1/ctr with the SQL route's discipline, against the real server over a lake large enough
for a heavy query: a few answers computed at once (a queue, then 429), a time limit, an answer
size limit; CSV cells that a spreadsheet would run as formulas neutralised; parameters at the
edges of time answered with a 400 naming them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import csv
import io
import threading
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ByteSize, SecretStr
from starlette.types import Message, Receive, Scope, Send

from alerts.settings import AlertSettings
from api.main import create_app
from api.metrics import RequestMetrics
from api.query_gate import QueryGate
from api.settings import ApiSettings
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from tests.support.api_server import running_api, running_app
from tests.support.lake_writer import cover, ctr_row, minute, write_batch, write_speed
from tests.support.lakes import new_lake

TOKEN = "limits-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Minute buckets grouped by every dimension: a heavy answer (one row per minute and combination).
HEAVY = {
    "start": minute(0).isoformat(),
    "end": minute(600).isoformat(),
    "granularity": "minute",
    "group_by": "campaign_id,ad_id,site_id,country,device_type",
    "limit": "1000",
}
FORMULAS = [
    '=HYPERLINK("http://evil.example/","click")',
    "+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "\tTAB",
    "\rCR",
]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    root = tmp_path_factory.mktemp("limits-lake")
    lake = new_lake(root)
    write_batch(lake, "run-a", [ctr_row(minute(5), 10, 1, campaign=value) for value in FORMULAS])
    cover(lake, "run-a", minute(0), minute(30))
    # 600 minutes x 400 combinations: 240,000 speed rows.
    write_speed(
        lake,
        [
            ctr_row(minute(m), 100, m % 7, campaign=f"c{c % 20}", ad=f"a{c}", country="DE")
            for m in range(30, 630)
            for c in range(400)
        ],
    )
    return lake


def _serve(lake: LakeSettings, **limits: object) -> Iterator[httpx.Client]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0, **limits)  # type: ignore[arg-type]
    with (
        running_api(settings, lake) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def client(lake: LakeSettings) -> Iterator[httpx.Client]:
    yield from _serve(lake)


def metric(client: httpx.Client, name: str) -> float | None:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def _heavy(n: int) -> dict[str, str]:
    """The heavy query, made distinct by ``n`` (no two share a cached answer)."""
    return {**HEAVY, "end": minute(600 - n).isoformat()}


@contextlib.contextmanager
def _holding_the_ctr_place(app: FastAPI) -> Iterator[None]:
    """The CTR gate's one place taken (on the server's loop, where the gate lives) for the block:
    a computation that overlaps every request sent meanwhile, whatever the machine's speed."""
    gate: QueryGate = app.state.ctr_gate
    loop: asyncio.AbstractEventLoop = app.state.server_loop
    held = threading.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.place("the test"):
            held.set()
            await release.wait()

    holder = asyncio.run_coroutine_threadsafe(hold(), loop)
    assert held.wait(60), holder
    try:
        yield
    finally:
        loop.call_soon_threadsafe(release.set)
        holder.result(timeout=60)


def test_one_at_a_time_then_429(lake: LakeSettings) -> None:
    settings = ApiSettings(
        token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0, ctr_workers=1, ctr_queue=0
    )
    app = create_app(settings, lake, KafkaSettings(), alert_settings=AlertSettings())
    with (
        running_app(app, settings) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        # Five heavy requests while one computation holds the place, then a sixth on its own.
        with (
            _holding_the_ctr_place(app),
            concurrent.futures.ThreadPoolExecutor(5) as pool,
        ):
            answers = list(
                pool.map(lambda n, c=client: c.get("/api/v1/ctr", params=_heavy(n)), range(5))
            )
        answers.append(client.get("/api/v1/ctr", params=_heavy(5)))
        statuses = sorted(a.status_code for a in answers)
        assert set(statuses) == {200, 429}, statuses
        busy = next(a for a in answers if a.status_code == 429)
        assert busy.headers["retry-after"] == "1"
        assert "API_CTR_WORKERS" in busy.json()["detail"]
        assert client.get("/api/v1/ctr", params=_heavy(0)).status_code == 200  # free again
        metrics = client.get("/metrics").text
        assert "ctr_api_queries_busy_total" in metrics


def test_queued_queries_wait_for_their_turn(lake: LakeSettings) -> None:
    # Ten minutes in the queue: the last waits for three heavy answers, however slow the machine.
    for client in _serve(lake, ctr_workers=1, ctr_queue=8, ctr_queue_timeout_s=600):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(lambda n, c=client: c.get("/api/v1/ctr", params=_heavy(n)), range(4))
            )
        assert [a.status_code for a in answers] == [200] * 4


def test_a_query_over_the_time_limit_is_stopped(lake: LakeSettings) -> None:
    """The server's time limit is the server's doing as much as the query's: a 503 with
    Retry-After (issue 66, finding 7: it was a 400), the time the refusal is remembered."""
    for client in _serve(lake, ctr_timeout_s=0.001, ctr_refusal_s=7.5):
        answer = client.get("/api/v1/ctr", params=_heavy(1))
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "8"
        assert "time limit" in answer.json()["detail"]


def test_an_answer_over_the_size_limit_is_refused(lake: LakeSettings) -> None:
    for client in _serve(lake, ctr_max_bytes=ByteSize(4096)):
        answer = client.get("/api/v1/ctr", params=_heavy(2))
        assert answer.status_code == 400
        assert answer.json()["parameter"] == "limit"
        assert "API_CTR_MAX_BYTES" in answer.json()["detail"]
        small = client.get("/api/v1/ctr", params={**_heavy(2), "limit": "3"})
        assert small.status_code == 200


def test_a_refused_answer_is_remembered_not_computed_again(lake: LakeSettings) -> None:
    """Issue 55: an answer over API_CTR_MAX_BYTES took 4.5 s of work on every request."""
    for client in _serve(lake, ctr_max_bytes=ByteSize(4096)):
        misses = metric(client, "ctr_api_cache_misses_total") or 0
        answers = [client.get("/api/v1/ctr", params=_heavy(3)) for _ in range(5)]
        assert {a.status_code for a in answers} == {400}
        assert len({a.json()["detail"] for a in answers}) == 1
        # Computed once: the four others were the remembered refusal.
        assert metric(client, "ctr_api_cache_misses_total") == misses + 1
        assert metric(client, "ctr_api_cache_refusals_total") == 4


def test_csv_cells_are_not_formulas(client: httpx.Client) -> None:
    params = {
        "start": minute(0).isoformat(),
        "end": minute(30).isoformat(),
        "group_by": "campaign_id",
        "order_by": "campaign_id",
    }
    text = client.get("/api/v1/ctr", params={**params, "format": "csv"}).text
    cells = [row[1] for row in csv.reader(io.StringIO(text))][1:]
    assert sorted(cells) == sorted(f"'{value}" for value in FORMULAS)
    # The JSON answer is the data as it is.
    rows = client.get("/api/v1/ctr", params=params).json()["rows"]
    assert sorted(row["campaign_id"] for row in rows) == sorted(FORMULAS)
    sql = client.post(
        "/api/v1/sql",
        params={"format": "csv"},
        json={"sql": "SELECT campaign_id FROM ctr_batch ORDER BY campaign_id"},
    )
    assert sorted(r[0] for r in csv.reader(io.StringIO(sql.text)))[:-1] == sorted(
        f"'{value}" for value in FORMULAS
    )


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"as_of": "1970-01-01T00:00:00Z"}, "as_of"),
        ({"as_of": "0001-01-01T00:00:00+14:00"}, "as_of"),
        ({"as_of": "9999-12-31T23:59:59-14:00"}, "as_of"),
        ({"end": "9999-12-31T23:59:59-14:00"}, "end"),
        ({"start": "0001-01-01T00:00:00+14:00"}, "start"),
    ],
)
def test_times_out_of_range_name_their_parameter(
    client: httpx.Client, params: dict[str, str], parameter: str
) -> None:
    answer = client.get("/api/v1/ctr", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["parameter"] == parameter


def test_a_huge_accept_is_not_echoed(client: httpx.Client) -> None:
    accept = ", ".join(["application/xml;q=0.9"] * 300)
    answer = client.get("/api/v1/ctr", headers={"Accept": accept})
    assert answer.status_code == 406
    assert len(answer.text) < 400
    assert f"({len(accept)} chars)" in answer.json()["detail"]


def test_metrics_count_what_was_sent() -> None:
    """A head the server could not write (uvicorn refuses a header value with CR/LF) counts as
    dropped, not as the status it named."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def refusing_send(message: Message) -> None:
        raise RuntimeError("Invalid HTTP header value.")

    async def accepting_send(message: Message) -> None:
        return None

    async def receive() -> Message:
        return {"type": "http.request"}

    registry = CollectorRegistry()
    metrics = RequestMetrics(app, registry)
    scope: Scope = {"type": "http", "method": "GET", "path": "/x"}
    with pytest.raises(RuntimeError):
        asyncio.run(metrics(scope, receive, refusing_send))
    asyncio.run(metrics(scope, receive, accepting_send))
    labels = {"method": "GET", "route": "unmatched"}
    assert registry.get_sample_value("ctr_api_requests_total", {**labels, "status": "dropped"}) == 1
    assert registry.get_sample_value("ctr_api_requests_total", {**labels, "status": "200"}) == 1
