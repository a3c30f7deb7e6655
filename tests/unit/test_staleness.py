"""Late arrivals in covered buckets: the staleness rule, the intervals a recompute runs over, and
how the API, /metrics and the SQL sandbox present a stale bucket (real Delta tables written with
delta-rs, the real API under uvicorn), and the drift summary."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import httpx
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pydantic import SecretStr

from api.settings import ApiSettings
from lake.coverage.log import read_runs
from lake.coverage.model import Coverage
from lake.coverage.staleness import (
    MAX_SPANS,
    StaleBucket,
    StaleInterval,
    arrival_spans,
    read_stale,
    recompute_intervals,
)
from lake.coverage.staleness import stale_intervals as merge_stale
from lake.settings import LakeSettings
from serving_layer.snapshots import SCHEMAS
from tests.support.api_server import running_api
from tests.support.lake_writer import (
    T0,
    cover,
    ctr_row,
    minute,
    write,
    write_arrivals,
    write_batch,
    write_speed,
)
from tests.support.lakes import new_lake

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RANGE = {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T12:00:00Z"}
ARCHIVED = T0 + dt.timedelta(hours=6)


def at(hour: int, minute_: int = 0) -> dt.datetime:
    return T0.replace(hour=hour, minute=minute_)


def bucket(when: dt.datetime, events: int = 1) -> StaleBucket:
    return StaleBucket(when, events, ARCHIVED)


def test_recompute_intervals_are_the_covered_parts_of_the_stale_hours() -> None:
    coverage = Coverage([(at(9), at(11, 30)), (at(14), at(15))])
    buckets = [bucket(at(10, 10)), bucket(at(10, 50)), bucket(at(11, 5)), bucket(at(14, 30))]
    assert recompute_intervals(buckets, coverage) == [(at(10), at(11, 30)), (at(14), at(15))]
    assert recompute_intervals([], coverage) == []


def test_consecutive_stale_minutes_merge_into_intervals() -> None:
    early = ARCHIVED - dt.timedelta(minutes=5)
    buckets = [
        StaleBucket(minute(1), 2, ARCHIVED),
        StaleBucket(minute(2), 3, early),
        StaleBucket(minute(4), 1, ARCHIVED),
    ]
    assert merge_stale(buckets) == [
        StaleInterval(minute(1), minute(3), 5, early),
        StaleInterval(minute(4), minute(5), 1, ARCHIVED),
    ]


@pytest.fixture
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    """10:00-10:30 covered by a run that read master/events v1; arrivals: v1 (counted by that
    run) for 10:01, v3 (after it) for 10:02 in two sites; speed rows everywhere."""
    root = tmp_path_factory.mktemp("stale-lake")
    lake = new_lake(root)
    write_batch(
        lake,
        "run-a",
        [
            ctr_row(minute(1), 100, 10),
            ctr_row(minute(2), 50, 5),
            ctr_row(minute(2), 20, 2, site="site-2"),
        ],
    )
    cover(lake, "run-a", minute(0), minute(30), input_version=1)
    write_speed(lake, [ctr_row(minute(2), 999, 99), ctr_row(minute(40), 7, 1)])
    write_arrivals(lake, 1, [ctr_row(minute(1), 100, 10)])
    write_arrivals(lake, 3, [ctr_row(minute(2), 6, 1), ctr_row(minute(2), 3, 0, site="site-2")])
    return lake


@pytest.fixture
def client(lake: LakeSettings) -> Iterator[httpx.Client]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with (
        running_api(settings, lake) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=30) as client,
    ):
        yield client


def rows(client: httpx.Client, **params: str) -> list[tuple[object, ...]]:
    response = client.get("/api/v1/ctr", params={**RANGE, **params})
    assert response.status_code == 200, response.text
    return [
        (
            r["bucket_start"][11:16],
            *(r[d] for d in params.get("group_by", "").split(",") if d),
            r["impressions"],
            r["clicks"],
            r["source"],
            r["stale_events"],
        )
        for r in response.json()["rows"]
    ]


def metric(client: httpx.Client, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_a_stale_bucket_adds_its_late_arrivals_and_never_says_batch(
    client: httpx.Client, lake: LakeSettings
) -> None:
    # 10:01: arrivals counted by the run (v1 <= v1): exact. 10:02: 9 impressions and a click
    # arrived after it (v3): batch + late, 'stale'. 10:40: not covered, speed.
    assert rows(client, granularity="minute") == [
        ("10:01", 100, 10, "batch", 0),
        ("10:02", 79, 8, "stale", 10),
        ("10:40", 7, 1, "speed", 0),
    ]
    assert rows(client, granularity="minute", group_by="site_id", end="2026-11-22T10:30:00Z") == [
        ("10:01", "site-1", 100, 10, "batch", 0),
        ("10:02", "site-1", 56, 6, "stale", 7),
        ("10:02", "site-2", 23, 2, "stale", 3),
    ]
    # An hour with a stale minute is not exact either; a filter keeps only its group's arrivals.
    assert rows(client, end="2026-11-22T10:30:00Z") == [("10:00", 179, 18, "stale", 10)]
    assert rows(client, end="2026-11-22T10:30:00Z", site_id="site-2") == [
        ("10:00", 23, 2, "stale", 3)
    ]
    assert rows(client) == [("10:00", 186, 19, "mixed", 10)]

    [view] = client.get("/api/v1/views").json()["views"]
    assert view["stale_intervals"] == [
        {
            "start": "2026-11-22T10:02:00Z",
            "end": "2026-11-22T10:03:00Z",
            "events": 10,
            "first_archived_at": "2026-11-22T16:00:00Z",
        }
    ]
    assert metric(client, "ctr_stale_buckets") == 1
    assert metric(client, "ctr_stale_events") == 10
    age = metric(client, "ctr_stale_age_seconds")
    assert age is not None
    assert age > 0

    sql = client.post(
        "/api/v1/sql",
        json={
            "sql": "SELECT source, sum(impressions), sum(stale_events) FROM ctr "
            "WHERE bucket_start < TIMESTAMPTZ '2026-11-22 10:30:00+00' GROUP BY 1 ORDER BY 1"
        },
    )
    assert sql.status_code == 200, sql.text
    assert sql.json()["rows"] == [["batch", 170, 0], ["late", 9, 10]]

    # The cheap check `ctr batch --stale` and the DAG use agrees, and plans the covered hour.
    buckets = read_stale(lake)
    coverage = read_runs(lake).of("ctr")
    assert [(b.bucket_start, b.events) for b in buckets] == [(minute(2), 10)]
    assert recompute_intervals(buckets, coverage) == [(minute(0), minute(30))]

    # A recompute that read v3 has replaced 10:00-10:30 but not recorded its coverage yet:
    # its rows already hold the late events, which must not be added a second time.
    data = pa.Table.from_pylist(
        [
            {**ctr_row(minute(1), 100, 10), "run_id": "run-b"},
            {**ctr_row(minute(2), 56, 6), "run_id": "run-b"},
            {**ctr_row(minute(2), 23, 2, site="site-2"), "run_id": "run-b"},
        ],
        schema=SCHEMAS["batch/ctr"],
    )
    write_deltalake(
        lake.table("batch/ctr"),
        data,
        mode="overwrite",
        predicate="bucket_start >= '2026-11-22T10:00:00Z' "
        "AND bucket_start < '2026-11-22T10:30:00Z'",
    )
    assert rows(client, granularity="minute", end="2026-11-22T10:30:00Z") == [
        ("10:01", 100, 10, "batch", 0),
        ("10:02", 79, 8, "batch", 0),
    ]
    # Its coverage row: the bucket is exact, from run-b.
    cover(lake, "run-b", minute(0), minute(30), input_version=3)
    assert rows(client, granularity="minute", end="2026-11-22T10:30:00Z") == [
        ("10:01", 100, 10, "batch", 0),
        ("10:02", 79, 8, "batch", 0),
    ]
    assert client.get("/api/v1/views").json()["views"][0]["stale_intervals"] == []
    assert metric(client, "ctr_stale_buckets") == 0
    assert metric(client, "ctr_stale_age_seconds") == 0
    assert read_stale(lake) == []


def test_drift_is_summarised_over_the_latest_runs(client: httpx.Client, lake: LakeSettings) -> None:
    def drift(
        run: str, when: dt.datetime, speed: tuple[int, int], batch: tuple[int, int]
    ) -> dict[str, object]:
        return {
            "run_id": run,
            "view": "ctr",
            "bucket_start": when,
            "speed_impressions": speed[0],
            "speed_clicks": speed[1],
            "batch_impressions": batch[0],
            "batch_clicks": batch[1],
            "recorded_at": T0 + dt.timedelta(hours=1),
        }

    write(
        lake,
        "batch/drift",
        [
            # +10 % impressions and clicks (duplicates)
            drift("run-a", minute(1), (1100, 110), (1000, 100)),
            drift("run-a", minute(2), (500, 96), (500, 120)),  # -20 % clicks (dropped late)
            # A minute of 3 late impressions: -33 % and -100 %, in the per-event error and the
            # sums, not in the per-minute percentiles (fewer than 100 events)
            drift("run-a", minute(3), (2, 0), (3, 1)),
        ],
    )
    [view] = client.get("/api/v1/views").json()["views"]
    assert view["drift"] == {
        "runs": 1,
        "buckets": 3,
        "impressions_weighted": pytest.approx(101 / 1503),
        "clicks_weighted": pytest.approx(35 / 221),
        "impressions_p50": pytest.approx(0.05),
        "impressions_p99": pytest.approx(0.099),
        "clicks_p50": pytest.approx(0.15),
        "clicks_p99": pytest.approx(0.199),
        "speed_minus_batch_impressions": 99,
        "speed_minus_batch_clicks": -15,
    }
    assert metric(client, "ctr_drift_relative_error", measure="clicks", quantile="0.5") == (
        pytest.approx(0.15)
    )
    assert metric(client, "ctr_drift_buckets") == 3
    sql = client.post("/api/v1/sql", json={"sql": "SELECT count(*) FROM drift"})
    assert sql.json()["rows"] == [[3]]


def test_the_batch_rows_read_are_the_arrivals_hours_not_the_span_between_them() -> None:
    """A late event of last week and today's arrivals: two reads of an hour each (widened by
    an attribution window), not a week of batch rows."""
    day = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    week_ago = day - dt.timedelta(days=7)
    buckets = pa.array(
        [day + dt.timedelta(minutes=m) for m in (5, 59, 61)]
        + [week_ago + dt.timedelta(minutes=30)],
        pa.timestamp("us", tz="UTC"),
    )
    minute = dt.timedelta(minutes=1)
    assert arrival_spans(buckets) == [
        (week_ago, week_ago + dt.timedelta(minutes=59)),
        (day, day + dt.timedelta(hours=2) - minute),  # two adjacent hours, one span
    ]
    window = dt.timedelta(minutes=10)
    assert arrival_spans(buckets, window)[0] == (week_ago - window, week_ago + 59 * minute + window)
    hourly = pa.array([day + dt.timedelta(hours=2 * n) for n in range(100)], buckets.type)
    spans = arrival_spans(hourly)
    assert len(spans) == MAX_SPANS
    assert all(any(a <= b <= z for a, z in spans) for b in hourly.to_pylist())
    assert arrival_spans(pa.array([], buckets.type)) == []
