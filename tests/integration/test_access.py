"""Advertiser-scoped keys over the real API (uvicorn on a loopback port, real Delta tables):
an advertiser's answer on every route is the admin's answer filtered to its campaigns, and holds
nothing of the others; revocation and expiry on the next request; the store across restarts."""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from access.key_store import create_key
from access.roles import Role
from api.settings import ApiSettings
from lake.settings import LakeSettings
from tests.support.api_server import running_api
from tests.support.lake_writer import (
    cover,
    ctr_row,
    event,
    minute,
    rejected,
    write,
    write_arrivals,
    write_batch,
    write_speed,
    write_status,
)
from tests.support.lakes import new_lake

TOKEN: Final = "access-test-token-0123456789"
CAMPAIGNS: Final = ("c1", "c2", "c3", "c4")
ADS: Final = ("a1", "a2")
COUNTRIES: Final = ("US", "DE")
RANGE: Final = {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T12:00:00Z"}
_key_names = iter(range(10**6))


def _rows(minutes: range, factor: int) -> list[dict[str, object]]:
    """Rows of every campaign, ad and country, with counts that differ by all of them."""
    rows = []
    for m in minutes:
        for c, campaign in enumerate(CAMPAIGNS):
            for a, ad in enumerate(ADS):
                for k, country in enumerate(COUNTRIES):
                    impressions = factor * (10 + m % 7 + 3 * c + 5 * a + 11 * k)
                    clicks = (m + c + a + k) % 5
                    rows.append(
                        ctr_row(
                            minute(m),
                            impressions,
                            clicks,
                            campaign=campaign,
                            ad=ad,
                            country=country,
                        )
                    )
    return rows


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    root = tmp_path_factory.mktemp("access-lake")
    lake = new_lake(root)
    write_batch(lake, "run-a", _rows(range(0, 30, 3), 2))
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(lake, _rows(range(0, 90, 4), 1))
    # Late events of two campaigns in covered minutes: stale buckets.
    write_arrivals(
        lake,
        5,
        [
            ctr_row(minute(3), 7, 1, campaign="c2", ad="a1"),
            ctr_row(minute(12), 4, 0, campaign="c3", ad="a2", country="DE"),
        ],
    )
    write(
        lake,
        "batch/drift",
        [
            {
                "run_id": "run-a",
                "view": "ctr",
                "bucket_start": minute(3),
                "speed_impressions": 110,
                "speed_clicks": 9,
                "batch_impressions": 100,
                "batch_clicks": 10,
                "recorded_at": minute(40),
            }
        ],
    )
    write(lake, "master/events", [event(0), event(1)])
    write(lake, "master/rejected", [rejected(5)])
    write_status(lake, offsets_behind=12)
    return lake


class KeyClock:
    """The time the API checks keys' expiry against: now, plus what a test moved it on by."""

    def __init__(self) -> None:
        self.ahead = dt.timedelta()

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.ahead


@pytest.fixture(scope="module")
def key_clock() -> KeyClock:
    return KeyClock()


@pytest.fixture(scope="module")
def base_url(lake: LakeSettings, key_clock: KeyClock) -> Iterator[str]:
    # keys_check_s=0: a revoke's next request is refused, whatever the time between them.
    settings_ = ApiSettings(
        token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0, sql_timeout_s=5, keys_check_s=0
    )
    with running_api(settings_, lake, key_clock=key_clock) as url:
        yield url


@pytest.fixture(scope="module")
def admin(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, headers=_auth(TOKEN), timeout=30) as client:
        yield client


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _key(
    lake: LakeSettings,
    role: Role,
    campaigns: tuple[str, ...] = (),
    ads: tuple[str, ...] = (),
    expires_at: dt.datetime | None = None,
) -> str:
    _, key = create_key(
        lake,
        f"{role}-{next(_key_names)}",
        role,
        campaigns=campaigns,
        ads=ads,
        expires_at=expires_at,
        # The scopes drawn here include campaigns with no rows (an empty answer is an answer).
        allow_unknown=True,
    )
    return key


def _get(url: str, key: str, path: str, params: Any = None) -> httpx.Response:
    return httpx.get(url + path, params=params, headers=_auth(key), timeout=30)


def _sql(url: str, key: str, sql: str, **body: object) -> httpx.Response:
    return httpx.post(
        url + "/api/v1/sql", json={"sql": sql, **body}, headers=_auth(key), timeout=30
    )


# -- the property: an advertiser's answer is the admin's filtered to its scope ------------------

scopes = st.tuples(
    st.lists(st.sampled_from((*CAMPAIGNS, "c9")), min_size=1, max_size=3, unique=True),
    st.lists(st.sampled_from(ADS), max_size=1, unique=True),
)
queries = st.fixed_dictionaries(
    {
        "granularity": st.sampled_from(("minute", "hour", "day", "all")),
        "group_by": st.lists(
            st.sampled_from(("campaign_id", "ad_id", "country")), max_size=2, unique=True
        ),
        "campaign_id": st.lists(st.sampled_from((*CAMPAIGNS, "c9")), max_size=2, unique=True),
        "ad_id": st.lists(st.sampled_from(ADS), max_size=1, unique=True),
        "country": st.lists(st.sampled_from(COUNTRIES), max_size=1, unique=True),
        "order": st.sampled_from((None, "-clicks", "impressions", "-ctr")),
        "limit": st.sampled_from((None, 1, 3, 50)),
        "version": st.sampled_from((None, 2, 3)),
        "as_of": st.booleans(),
        "format": st.sampled_from(("json", "csv")),
    }
)


def _params(query: dict[str, Any], campaigns: list[str], ads: list[str]) -> list[tuple[str, str]]:
    params = [*RANGE.items(), ("granularity", query["granularity"]), ("format", query["format"])]
    if query["group_by"]:
        params.append(("group_by", ",".join(query["group_by"])))
    if query["order"]:
        params.append(("order_by", query["order"]))
    for name, value in (("limit", query["limit"]), ("version", query["version"])):
        if value is not None:
            params.append((name, str(value)))
    if query["as_of"]:
        params.append(("as_of", query["as_of"]))
    params += [("campaign_id", c) for c in campaigns]
    params += [("ad_id", a) for a in ads]
    params += [("country", c) for c in query["country"]]
    return params


def _answer(response: httpx.Response, fmt: str) -> Any:
    assert response.status_code == 200, response.text
    if fmt == "csv":
        return list(csv.reader(io.StringIO(response.text))), response.headers["Ctr-Truncated"]
    body = response.json()
    del body["query"]  # the filters as sent, which differ by construction
    return body


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(scope=scopes, query=queries)
def test_an_advertisers_answer_is_the_admins_filtered_to_its_scope(
    lake: LakeSettings, base_url: str, scope: tuple[list[str], list[str]], query: dict[str, Any]
) -> None:
    campaigns, ads = scope
    key = _key(lake, "advertiser", tuple(campaigns), tuple(ads))
    if query["as_of"]:
        query = {**query, "as_of": dt.datetime.now(dt.UTC).isoformat()}
    asked = _get(base_url, key, "/api/v1/ctr", _params(query, query["campaign_id"], query["ad_id"]))
    # The admin asks for the same with the filters narrowed to the scope by hand ("c-none" and
    # "a-none" match no row: where the scope and the filter do not meet).
    wanted, wanted_ads = query["campaign_id"], query["ad_id"]
    seen = [c for c in wanted if c in campaigns] if wanted else campaigns
    seen_ads = [a for a in wanted_ads if a in ads] if wanted_ads and ads else wanted_ads or ads
    if ads and wanted_ads and not seen_ads:
        seen_ads = ["a-none"]
    expected = _get(base_url, TOKEN, "/api/v1/ctr", _params(query, seen or ["c-none"], seen_ads))
    mine, theirs = _answer(asked, query["format"]), _answer(expected, query["format"])
    if query["format"] == "json":
        # The stream's lag counts every campaign's records: not told to an advertiser.
        assert mine["freshness"].pop("speed_lag_records") is None
        theirs["freshness"].pop("speed_lag_records")
        for row in mine["rows"]:
            assert row.get("campaign_id", campaigns[0]) in campaigns
            assert row.get("ad_id", (ads or ADS)[0]) in (ads or ADS)
    assert mine == theirs


def test_sql_views_hold_the_scopes_rows_only(lake: LakeSettings, base_url: str) -> None:
    key = _key(lake, "advertiser", ("c2", "c3"))
    for table in (
        "ctr",
        "ctr_v2",
        "ctr_v3",
        "ctr_batch",
        "ctr_speed",
        "arrivals",
        "stale",
        "stale_v3",
        "speed_v3",
        "arrivals_v2",
    ):
        query = f"SELECT DISTINCT campaign_id FROM {table} ORDER BY 1"
        mine = _sql(base_url, key, query)
        assert mine.status_code == 200, (table, mine.text)
        everyone = _sql(base_url, TOKEN, query).json()["rows"]
        assert mine.json()["rows"] == [r for r in everyone if r[0] in ("c2", "c3")], table
    # The same sums as the admin's over the scope, as of now too.
    totals = "SELECT campaign_id, sum(impressions), sum(clicks) FROM ctr GROUP BY 1 ORDER BY 1"
    scoped = (
        "SELECT campaign_id, sum(impressions), sum(clicks) FROM ctr "
        "WHERE campaign_id IN ('c2', 'c3') GROUP BY 1 ORDER BY 1"
    )
    as_of = dt.datetime.now(dt.UTC).isoformat()
    assert (
        _sql(base_url, key, totals, as_of=as_of).json()["rows"]
        == (_sql(base_url, TOKEN, scoped, as_of=as_of).json()["rows"])
    )


PROBES: Final = {
    # query: (admin, analyst, advertiser) -- "ok", "hidden" (400, not readable with the key)
    # or "refused" (400, for everyone)
    "SELECT count(*) FROM events": ("ok", "hidden", "hidden"),
    "SELECT count(*) FROM rejected": ("ok", "hidden", "hidden"),
    "SELECT count(*) FROM drift": ("ok", "ok", "hidden"),
    "SELECT * FROM duckdb_tables()": ("refused", "refused", "refused"),
    "SELECT * FROM duckdb_views()": ("refused", "refused", "refused"),
    "SELECT * FROM read_parquet('lake/batch/ctr/*.parquet')": ("refused",) * 3,
    "SELECT * FROM query('SELECT * FROM events')": ("refused",) * 3,
    "SELECT current_setting('memory_limit')": ("refused",) * 3,
    "PRAGMA show_tables": ("refused",) * 3,
    "ATTACH ':memory:' AS other": ("refused",) * 3,
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_sql_probes_per_scope(lake: LakeSettings, base_url: str, probe: str) -> None:
    keys = {
        "admin": _key(lake, "admin"),
        "analyst": _key(lake, "analyst"),
        "advertiser": _key(lake, "advertiser", ("c1",)),
    }
    for (role, key), expected in zip(keys.items(), PROBES[probe], strict=True):
        response = _sql(base_url, key, probe)
        if expected == "ok":
            assert response.status_code == 200, (role, response.text)
        else:
            assert response.status_code == 400, (role, response.text)
            detail = response.json()["detail"]
            if expected == "hidden":
                assert f"not readable with an {role} key" in detail, (role, detail)


def test_an_advertisers_sandbox_names_and_counts_no_other_campaign(
    lake: LakeSettings, base_url: str
) -> None:
    key = _key(lake, "advertiser", ("c1",), ("a2",))
    for query in (
        "SHOW ALL TABLES",
        "SUMMARIZE ctr_batch",
        "SUMMARIZE arrivals",
        "EXPLAIN SELECT * FROM ctr_v3",
        "SELECT * FROM ctr_v3",
        "SELECT * FROM stale",
        "SELECT * FROM coverage",
        "SELECT * FROM registry",
        "WITH events AS (SELECT * FROM ctr_batch) SELECT * FROM events",
    ):
        response = _sql(base_url, key, query, max_rows=10000)
        assert response.status_code == 200, (query, response.text)
        text = response.text
        for other in ("c2", "c3", "c4", "a1", "events", "rejected", "drift"):
            if other == "events" and query.startswith("WITH"):
                continue  # the query's own CTE
            assert f'"{other}"' not in text, (query, other)
            assert f"'{other}'" not in text, (query, other)
    coverage = _sql(base_url, key, "SELECT rows_written FROM coverage").json()["rows"]
    assert coverage == [[None]]


# -- the other routes ---------------------------------------------------------------------------


def test_views_tell_an_advertiser_nothing_counted_over_other_campaigns(
    lake: LakeSettings, base_url: str
) -> None:
    everyone = _get(base_url, TOKEN, "/api/v1/views").json()
    (view,) = everyone["views"]
    assert view["drift"]["buckets"] == 1
    assert [i["events"] for i in view["stale_intervals"]] == [8, 4]  # impressions + clicks
    assert view["runs"] == 1
    assert view["tables"]
    assert everyone["freshness"]["speed_lag_records"] == 12

    for campaigns, stale in ((("c2",), [8]), (("c1",), []), (("c3", "c4"), [4])):
        mine = _get(base_url, _key(lake, "advertiser", campaigns), "/api/v1/views").json()
        (view,) = mine["views"]
        assert view["drift"] is None
        assert view["runs"] is None
        assert view["tables"] == {}
        assert all(v["rows"] is None and v["runs"] is None for v in view["versions"])
        assert [i["events"] for i in view["stale_intervals"]] == stale
        assert mine["freshness"]["speed_lag_records"] is None
        # What holds for everyone alike is told to everyone.
        assert view["covered_intervals"] == everyone["views"][0]["covered_intervals"]

    analyst = _get(base_url, _key(lake, "analyst"), "/api/v1/views").json()
    assert analyst == everyone


def test_metrics_and_health_by_scope(lake: LakeSettings, base_url: str) -> None:
    advertiser = _key(lake, "advertiser", ("c1",))
    analyst = _key(lake, "analyst")
    admin = _key(lake, "admin")
    assert _get(base_url, admin, "/metrics").status_code == 200
    assert _get(base_url, TOKEN, "/metrics").status_code == 200
    for key in (advertiser, analyst):
        response = _get(base_url, key, "/metrics")
        assert response.status_code == 403
        assert "admin" in response.json()["detail"]
    assert _get(base_url, "not-a-key-0123456789", "/metrics").status_code == 401
    assert "versions" in _get(base_url, analyst, "/healthz").json()
    assert _get(base_url, advertiser, "/healthz").json() == {"status": "ok"}
    me = _get(base_url, advertiser, "/api/v1/access").json()
    assert me["scope"] == "advertiser"
    assert me["campaigns"] == ["c1"]
    assert me["raw_tables"] is False
    assert me["metrics"] is False


def test_revoke_then_request_is_401_at_once(lake: LakeSettings, base_url: str) -> None:
    key, name = _named_key(lake, "revoke-me", ("c1",))
    assert _get(base_url, key, "/api/v1/ctr", RANGE).status_code == 200
    revoked = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "keys", "revoke", name],
        env=_cli_env(lake),
        capture_output=True,
        text=True,
        check=False,
    )
    assert revoked.returncode == 0, revoked.stderr
    # The very next request: no cache outlives a revoke.
    for path in ("/api/v1/ctr", "/api/v1/views", "/api/v1/access"):
        response = _get(base_url, key, path, RANGE if path.endswith("ctr") else None)
        assert response.status_code == 401, path
    assert _sql(base_url, key, "SELECT 1").status_code == 401


def test_an_expired_key_is_refused(lake: LakeSettings, base_url: str, key_clock: KeyClock) -> None:
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
    key = _key(lake, "advertiser", ("c1",), expires_at=expires)
    assert _get(base_url, key, "/api/v1/access").status_code == 200
    key_clock.ahead = dt.timedelta(seconds=3.1)  # the API's time past the expiry, no sleep
    try:
        assert _get(base_url, key, "/api/v1/access").status_code == 401
    finally:
        key_clock.ahead = dt.timedelta()


def test_keys_survive_a_restart_and_the_log_names_keys_not_secrets(
    lake: LakeSettings, base_url: str
) -> None:
    key, name = _named_key(lake, "restart", ("c4",))
    lines: list[str] = []
    handler = _Collect(lines)
    logging.getLogger("ctr.access").addHandler(handler)
    try:
        assert _get(base_url, key, "/api/v1/ctr", RANGE).status_code == 200
        assert _get(base_url, "wrong-key-0123456789", "/api/v1/ctr", RANGE).status_code == 401
        settings_ = ApiSettings(
            token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0, keys_check_s=0
        )
        with running_api(settings_, lake) as other:
            answer = _get(other, key, "/api/v1/ctr", {**RANGE, "group_by": "campaign_id"})
            assert answer.status_code == 200
            assert {r["campaign_id"] for r in answer.json()["rows"]} == {"c4"}
    finally:
        logging.getLogger("ctr.access").removeHandler(handler)
    assert any(f"key={name} role=advertiser GET /api/v1/ctr status=200" in line for line in lines)
    assert any("key=- role=- GET /api/v1/ctr status=401" in line for line in lines)
    assert not any(key in line for line in lines)


def _named_key(lake: LakeSettings, prefix: str, campaigns: tuple[str, ...]) -> tuple[str, str]:
    name = f"{prefix}-{next(_key_names)}"
    _, key = create_key(lake, name, "advertiser", campaigns=campaigns, allow_unknown=True)
    return key, name


def _cli_env(lake: LakeSettings) -> dict[str, str]:
    return {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
    }


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
