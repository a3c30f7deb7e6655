"""Answers never older than what the client has seen (issue 68), against the real server: every
answer names its versions in the Ctr-Versions header; a client sending back versions another
process has read makes this one look at the logs at once; versions nobody committed get a 503
with Retry-After, a malformed header a 400 naming it; /metrics counts the object-store requests
of keeping the snapshot current. The server looks at its logs only every minute here, so only
the header can make it see a new commit."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from api.settings import ApiSettings
from lake.settings import LakeSettings
from tests.support.api_server import running_api
from tests.support.lake_writer import cover, ctr_row, minute, write_batch, write_speed
from tests.support.lakes import new_lake

TOKEN = "versions-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RANGE = {"start": minute(0).isoformat(), "end": minute(60).isoformat(), "granularity": "hour"}


def impressions(response: httpx.Response) -> int:
    return sum(row["impressions"] for row in response.json()["rows"])


def versions(response: httpx.Response) -> dict[str, int]:
    pairs = (pair.split("=") for pair in response.headers["Ctr-Versions"].split(","))
    return {name: int(version) for name, version in pairs}


@pytest.fixture
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    lake = new_lake(tmp_path_factory.mktemp("versions-lake"))
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 3)])
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(lake, [ctr_row(minute(40), 10, 1)])
    return lake


@pytest.fixture
def client(lake: LakeSettings) -> Iterator[httpx.Client]:
    settings = ApiSettings(
        token=SecretStr(TOKEN), refresh_s=60, refresh_seldom_s=60, cache_stale_s=60
    )
    with (
        running_api(settings, lake) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        yield client


def test_every_answer_names_its_versions(client: httpx.Client) -> None:
    ctr = client.get("/api/v1/ctr", params=RANGE)
    assert ctr.status_code == 200, ctr.text
    assert versions(ctr)["speed/ctr"] == ctr.json()["freshness"]["versions"]["speed/ctr"] == 0
    assert versions(ctr)["batch/ctr"] == 0
    sql = client.post("/api/v1/sql", json={"sql": "SELECT count(*) AS n FROM ctr_speed"})
    assert sql.status_code == 200, sql.text
    assert versions(sql) == versions(ctr)
    views = client.get("/api/v1/views")
    assert versions(views) == versions(ctr)


def test_versions_seen_elsewhere_are_read_at_once(client: httpx.Client, lake: LakeSettings) -> None:
    first = client.get("/api/v1/ctr", params=RANGE)
    assert impressions(first) == 110
    # Another process commits, and another replica answered from it: its client sends the
    # versions it saw. This server would not look for a minute.
    write_speed(lake, [ctr_row(minute(41), 20, 2)])
    assert client.get("/api/v1/ctr", params=RANGE).json()["rows"] == first.json()["rows"]
    seen = {**versions(first), "speed/ctr": 1}
    header = {"Ctr-Versions": ",".join(f"{n}={v}" for n, v in seen.items())}
    caught_up = client.get("/api/v1/ctr", params=RANGE, headers=header)
    assert caught_up.status_code == 200, caught_up.text
    assert versions(caught_up)["speed/ctr"] == 1
    assert impressions(caught_up) == 130
    # And never back: the cached answer of version 0 is not given to a client that saw 1.
    again = client.get("/api/v1/ctr", params=RANGE, headers=header)
    assert versions(again)["speed/ctr"] == 1
    sql = client.post(
        "/api/v1/sql", json={"sql": "SELECT sum(impressions) AS n FROM ctr_speed"}, headers=header
    )
    assert sql.json()["rows"] == [[30]]


def test_versions_nobody_committed_get_a_503(client: httpx.Client) -> None:
    future = client.get("/api/v1/ctr", params=RANGE, headers={"Ctr-Versions": "speed/ctr=99"})
    assert future.status_code == 503
    assert future.headers["Retry-After"] == "1"
    assert "speed/ctr 99" in future.json()["detail"]
    # Tables the API does not serve are not its to wait for.
    other = client.get("/api/v1/ctr", params=RANGE, headers={"Ctr-Versions": "not/served=5"})
    assert other.status_code == 200


@pytest.mark.parametrize("value", ["speed/ctr", "speed/ctr=-1", "speed/ctr=1;x=2", "a=" + "9" * 30])
def test_a_malformed_header_is_a_400_naming_it(client: httpx.Client, value: str) -> None:
    answer = client.get("/api/v1/ctr", params=RANGE, headers={"Ctr-Versions": value})
    assert answer.status_code == 400
    assert answer.json()["parameter"] == "Ctr-Versions"


def test_metrics_count_the_object_store_requests(client: httpx.Client) -> None:
    client.get("/api/v1/ctr", params=RANGE)
    counts = {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name == "ctr_object_store_requests_total"
    }
    assert counts["reload"] >= 3  # the tables that exist, read once each
    assert counts["status"] >= 1
