"""The HTTP API over a real uvicorn server on a loopback port and real Delta tables."""

from __future__ import annotations

import concurrent.futures
import csv
import io
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from api.settings import ApiSettings
from lake.settings import LakeSettings
from serving_layer.wilson import wilson_interval
from tests.support.api_server import running_api
from tests.support.lake_writer import (
    cover,
    ctr_row,
    minute,
    rejected,
    write,
    write_batch,
    write_speed,
    write_status,
)
from tests.support.lakes import new_lake

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
METRICS_TOKEN = "metrics-scrape-token-0123456789"
RANGE = {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T12:00:00Z"}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    root = tmp_path_factory.mktemp("api-lake")
    lake = new_lake(root)
    write_batch(
        lake,
        "run-a",
        [ctr_row(minute(5), 100, 10, campaign="c1"), ctr_row(minute(6), 50, 1, campaign="c2")],
    )
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(
        lake,
        [
            ctr_row(minute(5), 1, 1, campaign="c1"),
            ctr_row(minute(45), 40, 4, campaign="c1", country="DE"),
            ctr_row(minute(70), 20, 2, campaign="c2"),
        ],
    )
    write_status(lake, offsets_behind=3)
    write(
        lake,
        "master/rejected",
        [
            rejected(offset, reason)
            for offset, reason in enumerate(
                ["record: not JSON", "country: 'XX' is not ISO 3166-1", "record: no value"]
            )
        ],
    )
    return lake


def serve(settings: ApiSettings, lake: LakeSettings) -> Iterator[str]:
    with running_api(settings, lake) as url:
        yield url


@pytest.fixture(scope="module")
def base_url(lake: LakeSettings) -> Iterator[str]:
    yield from serve(
        ApiSettings(
            token=SecretStr(TOKEN),
            metrics_token=SecretStr(METRICS_TOKEN),
            refresh_s=0,
            max_rows=1000,
            sql_timeout_s=2,
            cache_stale_s=0,
        ),
        lake,
    )


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, headers=AUTH, timeout=30) as client:
        yield client


def test_ctr_hourly_by_campaign(client: httpx.Client) -> None:
    response = client.get("/api/v1/ctr", params={**RANGE, "group_by": "campaign_id"})
    assert response.status_code == 200
    body = response.json()
    assert [
        (
            r["bucket_start"],
            r["campaign_id"],
            r["impressions"],
            r["clicks"],
            r["source"],
            r["run_ids"],
        )
        for r in body["rows"]
    ] == [
        ("2026-11-22T10:00:00Z", "c1", 140, 14, "mixed", ["run-a"]),
        ("2026-11-22T10:00:00Z", "c2", 50, 1, "mixed", ["run-a"]),
        ("2026-11-22T11:00:00Z", "c2", 20, 2, "speed", []),
    ]
    first = body["rows"][0]
    assert first["ctr"] == pytest.approx(0.1)
    # The function's known values are tested in test_serving.py.
    assert (first["ctr_ci_low"], first["ctr_ci_high"]) == pytest.approx(wilson_interval(14, 140))
    assert body["truncated"] is False
    assert body["freshness"] == {
        "latest_covered_bucket": "2026-11-22T10:29:00Z",
        "latest_speed_bucket": "2026-11-22T11:10:00Z",
        "speed_updated_at": "2026-11-22T12:00:00Z",
        "speed_watermark": "2026-11-22T11:58:00Z",
        "speed_lag_records": 3,
        "versions": {
            "batch/ctr": 0,
            "batch/coverage": 0,
            "speed/ctr": 0,
            "master/arrivals": None,
            "views/registry": None,
        },
        "settle_minutes": 10,  # version 1: its lateness
        "clicks_window_minutes": 0,  # version 1 counts clicks in their own minute
    }
    assert body["query"]["group_by"] == ["campaign_id"]


def test_ctr_minute_filters_and_top_n(client: httpx.Client) -> None:
    response = client.get(
        "/api/v1/ctr",
        params=[*RANGE.items(), ("granularity", "minute"), ("campaign_id", "c1")],
    )
    assert [(r["bucket_start"], r["clicks"], r["source"]) for r in response.json()["rows"]] == [
        ("2026-11-22T10:05:00Z", 10, "batch"),
        ("2026-11-22T10:45:00Z", 4, "speed"),
    ]
    top = client.get(
        "/api/v1/ctr",
        params={
            **RANGE,
            "granularity": "day",
            "group_by": "campaign_id",
            "order_by": "-clicks",
            "limit": 1,
        },
    ).json()
    assert [(r["campaign_id"], r["clicks"]) for r in top["rows"]] == [("c1", 14)]
    assert top["truncated"] is True


def test_ctr_totals_over_the_range(client: httpx.Client) -> None:
    top = client.get(
        "/api/v1/ctr",
        params={**RANGE, "granularity": "all", "group_by": "campaign_id", "order_by": "-clicks"},
    ).json()
    # c1: batch 100/10 at 10:05 (its speed row there is covered) + speed 40/4 at 10:45;
    # c2: batch 50/1 + speed 20/2. 30 of the range's 120 minutes are covered.
    assert [
        (
            r["bucket_start"],
            r["campaign_id"],
            r["impressions"],
            r["clicks"],
            r["source"],
            r["covered_fraction"],
        )
        for r in top["rows"]
    ] == [
        ("2026-11-22T10:00:00Z", "c1", 140, 14, "mixed", 0.25),
        ("2026-11-22T10:00:00Z", "c2", 70, 3, "mixed", 0.25),
    ]
    assert top["query"]["granularity"] == "all"
    exact = client.get(
        "/api/v1/ctr",
        params={
            "start": "2026-11-22T10:00:00Z",
            "end": "2026-11-22T10:30:00Z",
            "granularity": "all",
        },
    ).json()
    assert [
        (r["impressions"], r["clicks"], r["source"], r["covered_fraction"]) for r in exact["rows"]
    ] == [(150, 11, "batch", 1.0)]


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def test_ctr_as_csv_has_the_rows_of_the_json_answer(client: httpx.Client) -> None:
    params = {**RANGE, "granularity": "all", "group_by": "campaign_id,country"}
    answer = client.get("/api/v1/ctr", params={**params, "format": "csv"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/csv; charset=utf-8"
    assert answer.text.startswith(
        "bucket_start,campaign_id,country,impressions,clicks,raw_clicks,orphan_clicks,"
        "repeat_clicks,ctr,ctr_ci_low,ctr_ci_high,source,covered_fraction,stale_events,run_ids\r\n"
    )
    header, *lines = _csv(answer.text)
    rows = client.get("/api/v1/ctr", params=params).json()["rows"]
    assert [dict(zip(header, line, strict=True)) for line in lines] == [
        {
            **{k: "" if v is None else str(v) for k, v in row.items() if k != "run_ids"},
            "run_ids": " ".join(row["run_ids"]),
        }
        for row in rows
    ]
    # Version 1 has no click attribution: raw clicks are the clicks, no orphan or repeat counts.
    assert [line[:8] + line[11:] for line in lines] == [
        ["2026-11-22T10:00:00Z", "c1", "DE", "40", "4", "4", "", "", "mixed", "0.25", "0", ""],
        [
            "2026-11-22T10:00:00Z",
            "c1",
            "US",
            "100",
            "10",
            "10",
            "",
            "",
            "mixed",
            "0.25",
            "0",
            "run-a",
        ],
        ["2026-11-22T10:00:00Z", "c2", "US", "70", "3", "3", "", "", "mixed", "0.25", "0", "run-a"],
    ]
    assert (answer.headers["ctr-truncated"], answer.headers["ctr-view"]) == ("false", "ctr@1")
    assert answer.headers["ctr-latest-covered-bucket"] == "2026-11-22T10:29:00Z"


@pytest.mark.parametrize(
    ("accept", "params", "media_type"),
    [
        ("text/csv", {}, "text/csv"),
        ("text/csv, */*", {}, "text/csv"),
        ("text/*", {}, "text/csv"),
        ("text/csv;q=0.5, application/json", {}, "application/json"),
        ("*/*", {}, "application/json"),
        ("text/csv;q=0, */*", {}, "application/json"),
        ("application/json;q=0, text/csv;q=0.1", {}, "text/csv"),
        ("application/json", {"format": "csv"}, "text/csv"),
        ("text/csv", {"format": "json"}, "application/json"),
    ],
)
def test_the_format_follows_accept_unless_format_is_given(
    client: httpx.Client, accept: str, params: dict[str, str], media_type: str
) -> None:
    for answer in (
        client.get("/api/v1/ctr", params={**RANGE, **params}, headers={"Accept": accept}),
        client.post(
            "/api/v1/sql", params=params, headers={"Accept": accept}, json={"sql": "SELECT 1"}
        ),
    ):
        assert answer.status_code == 200
        assert answer.headers["content-type"].split(";")[0] == media_type


def test_an_unacceptable_accept_is_a_406_and_a_bad_format_a_400(client: httpx.Client) -> None:
    refused = client.get("/api/v1/ctr", params=RANGE, headers={"Accept": "application/xml"})
    assert refused.status_code == 406
    assert refused.json()["parameter"] == "Accept"
    assert "application/json, text/csv" in refused.json()["detail"]
    for answer in (
        client.get("/api/v1/ctr", params={**RANGE, "format": "xml"}),
        client.post("/api/v1/sql", params={"format": "xml"}, json={"sql": "SELECT 1"}),
    ):
        assert answer.status_code == 400
        assert answer.json()["parameter"] == "format"


def test_sql_as_csv(client: httpx.Client) -> None:
    answer = client.post(
        "/api/v1/sql",
        params={"format": "csv"},
        json={"sql": "SELECT source, sum(clicks) AS clicks FROM ctr GROUP BY 1 ORDER BY 1"},
    )
    assert answer.status_code == 200
    assert answer.text == "source,clicks\r\nbatch,11\r\nspeed,6\r\n"
    assert answer.headers["ctr-column-types"] == "VARCHAR,HUGEINT"
    assert answer.headers["ctr-truncated"] == "false"
    values = client.post(
        "/api/v1/sql",
        headers={"Accept": "text/csv"},
        json={
            "sql": "SELECT [1, 2] AS l, NULL AS n, true AS b, 'a,\"b\"' AS s, "
            "TIMESTAMPTZ '2026-11-22 10:00:00+00' AS t",
            "max_rows": 1,
        },
    )
    assert values.text == 'l,n,b,s,t\r\n"[1,2]",,true,"a,""b""",2026-11-22T10:00:00Z\r\n'


def test_views(client: httpx.Client) -> None:
    body = client.get("/api/v1/views").json()
    [view] = body["views"]
    assert view["name"] == "ctr"
    assert view["covered_intervals"] == [
        {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T10:30:00Z"}
    ]
    assert view["runs"] == 1
    assert view["latest_speed_bucket"] == "2026-11-22T11:10:00Z"
    assert view["tables"]["batch"] == {"table": "batch/ctr", "version": 0, "rows": 2, "files": 1}
    assert view["tables"]["speed"]["rows"] == 3
    assert body["freshness"]["speed_lag_records"] == 3


def test_sql(client: httpx.Client) -> None:
    response = client.post(
        "/api/v1/sql",
        json={"sql": "SELECT source, sum(clicks) AS clicks FROM ctr GROUP BY 1 ORDER BY 1"},
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["columns"], body["rows"], body["truncated"]) == (
        ["source", "clicks"],
        [["batch", 11], ["speed", 6]],
        False,
    )
    assert client.post(
        "/api/v1/sql", json={"sql": "SELECT * FROM range(10)", "max_rows": 3}
    ).json()["truncated"]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
        ("COPY ctr TO '/tmp/out.csv'", "COPY statements are not allowed"),
        ("ATTACH '/tmp/x.db'", "ATTACH statements are not allowed"),
        ("INSTALL httpfs", "INSTALL statements are not allowed"),
        ("LOAD httpfs", "LOAD statements are not allowed"),
        ("SET threads = 1", "SET statements are not allowed"),
        ("PRAGMA version", "PRAGMA statements are not allowed"),
    ],
)
def test_sql_refusals_are_400s(client: httpx.Client, sql: str, message: str) -> None:
    response = client.post("/api/v1/sql", json={"sql": sql})
    assert response.status_code == 400
    assert response.json()["parameter"] == "sql"
    assert message in response.json()["detail"]


def test_sql_stopped_at_the_time_limit_is_a_503_to_retry(client: httpx.Client) -> None:
    """The server's limit, not a bad request (issue 66, finding 7: it was a 400): a 503 with
    Retry-After, the key's back-off after its strike."""
    endless = "SELECT count(*) FROM range(1000000) a, range(1000000) b WHERE a.range * b.range = -1"
    response = client.post("/api/v1/sql", json={"sql": endless})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert "sql: the query was stopped at the time limit of 2 s" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/api/v1/ctr", "/api/v1/views"])
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"}],
)
def test_auth_required(base_url: str, path: str, headers: dict[str, str]) -> None:
    response = httpx.get(base_url + path, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


def test_sql_needs_auth(base_url: str) -> None:
    assert httpx.post(f"{base_url}/api/v1/sql", json={"sql": "SELECT 1"}).status_code == 401


@pytest.mark.parametrize(
    ("params", "parameter", "message"),
    [
        ({"granularity": "week"}, "granularity", "must be one of minute, hour, day"),
        ({"group_by": "campaign_id,city"}, "group_by", "unknown dimension 'city'"),
        ({"city": "Paris"}, "city", "unknown parameter"),
        ({"end": "2026-11-22T09:00:00Z"}, "end", "must be after start"),
        ({"end": "2027-01-22T10:00:00Z"}, "end", "too large"),
        ({"start": "yesterday"}, "start", "valid datetime"),
        ({"limit": "many"}, "limit", "valid integer"),
        ({"limit": "0"}, "limit", "greater than or equal to 1"),
        ({"limit": "1001"}, "limit", "between 1 and 1000"),
        ({"order_by": "country"}, "order_by", "group by it first"),
        ({"order_by": "-revenue"}, "order_by", "cannot order by 'revenue'"),
    ],
)
def test_bad_parameters_are_400s_naming_them(
    client: httpx.Client, params: dict[str, str], parameter: str, message: str
) -> None:
    response = client.get("/api/v1/ctr", params={**RANGE, **params})
    assert response.status_code == 400
    body = response.json()
    assert body["parameter"] == parameter
    assert message in body["detail"]


@pytest.mark.parametrize(
    ("body", "parameter"),
    [({}, "sql"), ({"sql": 5}, "sql"), ({"sql": "SELECT 1", "max_rows": 0}, "max_rows")],
)
def test_bad_sql_bodies_are_400s(
    client: httpx.Client, body: dict[str, object], parameter: str
) -> None:
    response = client.post("/api/v1/sql", json=body)
    assert response.status_code == 400
    assert response.json()["parameter"] == parameter


def test_healthz_says_up_to_anyone_and_versions_to_the_token(
    client: httpx.Client, base_url: str
) -> None:
    assert httpx.get(f"{base_url}/healthz").json() == {"status": "ok"}
    wrong = {"Authorization": "Bearer not-the-token-at-all-0123"}
    assert httpx.get(f"{base_url}/healthz", headers=wrong).json() == {"status": "ok"}
    health = client.get("/healthz")
    assert health.json() == {
        "status": "ok",
        "versions": {
            "batch/ctr": 0,
            "batch/coverage": 0,
            "speed/ctr": 0,
            "master/events": None,
            "master/rejected": 0,
            "master/arrivals": None,
            "batch/drift": None,
            "views/registry": None,
            "batch/ctr_v2": None,
            "batch/ctr_v3": None,
            "batch/ctr_hours": None,
            "batch/ctr_v2_hours": None,
            "batch/ctr_v3_hours": None,
            "batch/ctr_reach": None,
            "batch/ctr_v2_reach": None,
            "batch/ctr_v3_reach": None,
        },
    }


@pytest.mark.parametrize("token", [None, "not-the-token-at-all-0123"])
def test_metrics_need_a_token(base_url: str, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = httpx.get(f"{base_url}/metrics", headers=headers)
    assert answer.status_code == 401
    assert "API_METRICS_TOKEN" in answer.json()["detail"]
    assert answer.headers["www-authenticate"] == "Bearer"
    assert "ctr_table_version" not in answer.text


@pytest.mark.parametrize("token", [METRICS_TOKEN, TOKEN])
def test_metrics_with_the_scrape_token_or_the_api_token(
    client: httpx.Client, base_url: str, token: str
) -> None:
    client.get("/api/v1/ctr", params=RANGE)
    text = httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    ctr_ok = (("method", "GET"), ("route", "/api/v1/ctr"), ("status", "200"))
    assert samples[("ctr_api_requests_total", ctr_ok)] >= 1
    assert samples[("ctr_api_request_duration_seconds_count", (("route", "/api/v1/ctr"),))] >= 1
    assert samples[("ctr_table_version", (("table", "batch/ctr"),))] == 0
    assert samples[("ctr_table_version", (("table", "master/events"),))] == -1
    assert samples[("ctr_latest_covered_bucket_timestamp_seconds", ())] == minute(29).timestamp()
    assert samples[("ctr_latest_speed_bucket_timestamp_seconds", ())] == minute(70).timestamp()
    assert samples[("ctr_speed_lag_records", ())] == 3
    assert samples[("ctr_rejected_records_total", (("reason", "record"),))] == 2
    assert samples[("ctr_rejected_records_total", (("reason", "country"),))] == 1


def test_openapi_and_docs(base_url: str) -> None:
    schema = httpx.get(f"{base_url}/openapi.json").json()
    assert {"/api/v1/ctr", "/api/v1/views", "/api/v1/sql", "/healthz", "/metrics"} <= set(
        schema["paths"]
    )
    ctr = schema["paths"]["/api/v1/ctr"]["get"]
    names = {p["name"] for p in ctr["parameters"]}
    assert {"campaign_id", "ad_id", "site_id", "country", "device_type", "granularity"} <= names
    # Both formats of both data endpoints are documented, and how to ask for them.
    sql = schema["paths"]["/api/v1/sql"]["post"]
    for operation in (ctr, sql):
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/csv"}
        assert "406" in operation["responses"]
        [format_] = [p for p in operation["parameters"] if p["name"] == "format"]
        assert format_["schema"]["anyOf"][0]["enum"] == ["json", "csv"]
    assert "Ctr-Truncated" in ctr["responses"]["200"]["headers"]
    [granularity] = [p for p in ctr["parameters"] if p["name"] == "granularity"]
    assert "all: one bucket spanning [start, end)" in granularity["description"]
    assert httpx.get(f"{base_url}/docs").status_code == 200


def test_a_fresh_deployment_answers_empty(tmp_path: Path) -> None:
    empty = new_lake(tmp_path)
    for url in serve(ApiSettings(token=SecretStr(TOKEN), refresh_s=0), empty):
        ctr = httpx.get(f"{url}/api/v1/ctr", params=RANGE, headers=AUTH)
        assert ctr.status_code == 200
        assert ctr.json()["rows"] == []
        assert ctr.json()["freshness"]["latest_covered_bucket"] is None
        views = httpx.get(f"{url}/api/v1/views", headers=AUTH).json()
        assert views["views"][0]["tables"]["batch"] == {
            "table": "batch/ctr",
            "version": None,
            "rows": 0,
            "files": 0,
        }
        sql = httpx.post(
            f"{url}/api/v1/sql", json={"sql": "SELECT count(*) FROM ctr"}, headers=AUTH
        )
        assert sql.json()["rows"] == [[0]]
        assert httpx.get(f"{url}/metrics", headers=AUTH).status_code == 200


def test_concurrent_first_requests_of_a_new_version_all_succeed(
    lake: LakeSettings, tmp_path: Path
) -> None:
    # A fresh server: each table version's derived relations are built on first use, by
    # whichever of these requests gets there first.
    queries = [
        {**RANGE, "granularity": g, "group_by": by}
        for g in ("minute", "hour", "day")
        for by in ("campaign_id", "country", "device_type")
    ]
    for url in serve(ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0), lake):
        with (
            httpx.Client(base_url=url, headers=AUTH) as http,
            concurrent.futures.ThreadPoolExecutor(len(queries)) as pool,
        ):
            codes = [r.status_code for r in pool.map(_ctr_getter(http), queries)]
        assert codes == [200] * len(queries)


def _ctr_getter(http: httpx.Client) -> Callable[[dict[str, str]], httpx.Response]:
    return lambda params: http.get("/api/v1/ctr", params=params)


def test_new_versions_are_served(lake: LakeSettings, client: httpx.Client) -> None:
    before = client.get("/api/v1/ctr", params={**RANGE, "granularity": "day"}).json()
    write_speed(lake, [ctr_row(minute(100), 1000, 0, campaign="c9")])
    after = client.get("/api/v1/ctr", params={**RANGE, "granularity": "day"}).json()
    assert after["rows"][0]["impressions"] == before["rows"][0]["impressions"] + 1000
    assert (
        after["freshness"]["versions"]["speed/ctr"]
        == before["freshness"]["versions"]["speed/ctr"] + 1
    )


def test_settings_refuse_a_missing_or_short_token() -> None:
    with pytest.raises(ValueError, match="token"):
        ApiSettings.model_validate({})
    with pytest.raises(ValueError, match="at least 16 characters"):
        ApiSettings(token=SecretStr("short"))


def test_dashboard_is_served_without_token(
    tmp_path: Path, lake: LakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<html>dashboard</html>")
    (static / "app.js").write_text("console.log(1)")
    monkeypatch.setattr("api.routes.dashboard.STATIC_DIR", static)
    for url in serve(ApiSettings(token=SecretStr(TOKEN)), lake):
        assert httpx.get(f"{url}/").text == "<html>dashboard</html>"
        assert httpx.get(f"{url}/static/app.js").text == "console.log(1)"
    (static / "index.html").unlink()
    for url in serve(ApiSettings(token=SecretStr(TOKEN)), lake):
        assert httpx.get(f"{url}/").status_code == 404
