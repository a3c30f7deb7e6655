"""Versioned views on real Spark and Delta, served by the real API: build version 2 of ``ctr``
(without device_type 'other') from the master dataset while version 1 serves, diff them, publish
while clients read (every answer all-v1 or all-v2), roll back to v1's exact answers, query an
unpublished version and earlier moments."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from pyspark.sql import SparkSession

import batch_layer.job
from api.settings import ApiSettings
from batch_layer.interval import Interval
from lake.catalog import MASTER_EVENTS
from lake.registry import read_registry
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from serving_layer.diff import diff_versions
from serving_layer.reader import SnapshotReader
from serving_layer.service import ServingLayer
from tests.support.api_server import running_api
from tests.support.events import archive, event
from tests.support.waiting import wait_until
from views.definitions import definition
from workflows.build import build, plan_build

CTR = str(Path(sys.executable).with_name("ctr"))
TOKEN = "test-token-0123456789"
T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
RANGE = {"start": "2026-11-20T08:00:00Z", "end": "2026-11-20T10:00:00Z", "granularity": "hour"}
V1, V2 = definition("ctr", 1), definition("ctr", 2)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def device_event(n: int, kind: str, when: dt.datetime, device: str) -> dict[str, object]:
    return {**event(f"e{n}", kind, when, offset=n), "device_type": device}


# Two hours: 12 events, 5 of them from devices the ad servers could not classify ('other').
EVENTS = [
    device_event(1, "impression", at(1), "mobile"),
    device_event(2, "impression", at(1.5), "other"),
    device_event(3, "click", at(2), "other"),
    device_event(4, "impression", at(5), "desktop"),
    device_event(5, "click", at(5.5), "desktop"),
    device_event(6, "impression", at(30), "other"),
    device_event(7, "impression", at(61), "mobile"),
    device_event(8, "impression", at(62), "other"),
    device_event(9, "impression", at(62.5), "tablet"),
    device_event(10, "click", at(63), "tablet"),
    device_event(11, "impression", at(90), "other"),
    device_event(12, "impression", at(91), "mobile"),
]
TOTALS = {1: (9, 3), 2: (5, 2)}  # (impressions, clicks) per version over the two hours


def ctr_cli(lake: LakeSettings, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
    }
    env["COLUMNS"] = "200"
    return subprocess.run(
        [CTR, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def versioned(spark: SparkSession, lake: LakeSettings) -> LakeSettings:
    """The two hours archived and covered by version 1, version 2 built."""
    archive(spark, lake, EVENTS)
    for hour in Interval(T0, T0 + dt.timedelta(hours=2)).hours():
        batch_layer.job.run(spark, hour, lake=lake)
    plan = plan_build(lake, V2)
    assert [(i.start, i.end) for i in plan.intervals] == [
        (T0, T0 + dt.timedelta(hours=1)),
        (T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2)),
    ]
    build(spark, lake, plan)
    assert read_registry(lake).state("ctr", 2) == "ready"
    assert plan_build(lake, V2).intervals == ()  # resumable: nothing left to build
    return lake


@pytest.fixture
def client(versioned: LakeSettings) -> Iterator[httpx.Client]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with (
        running_api(settings, versioned) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        yield client


def answer(client: httpx.Client, **params: str) -> dict[str, object]:
    response = client.get("/api/v1/ctr", params={**RANGE, **params})
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def totals(body: dict[str, object]) -> tuple[int, int]:
    rows = body["rows"]
    assert isinstance(rows, list)
    return sum(r["impressions"] for r in rows), sum(r["clicks"] for r in rows)


def check_diff(lake: LakeSettings) -> None:
    """The diff of v1 and v2: exactly the 'other' rows, which only v1 has."""
    serving = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        result = diff_versions(serving.reader, V1, V2, start=T0, end=T0 + dt.timedelta(hours=2))
    finally:
        serving.close()
    # v1 has 11 (minute, dimensions) rows, 5 of them 'other'; v2 the 6 others, unchanged.
    assert (result.rows_compared, result.rows_changed) == (11, 5)
    assert (result.only_in_a, result.only_in_b) == (5, 0)
    assert result.impressions == (9, 5)
    assert result.clicks == (3, 2)
    assert sorted((c.bucket_start, c.dimensions["device_type"]) for c in result.largest) == [
        (at(minute), "other") for minute in (1, 2, 30, 62, 90)
    ]


def publish_while_reading(client: httpx.Client, lake: LakeSettings) -> None:
    """Publish v2 while four clients read: every answer is all-v1 or all-v2, and both occur."""
    seen: list[tuple[int, tuple[int, int]]] = []
    stop = threading.Event()

    def reader() -> None:
        with httpx.Client(base_url=str(client.base_url), headers=client.headers) as own:
            while not stop.is_set():
                body = answer(own)
                view = body["view"]
                assert isinstance(view, dict)
                seen.append((view["version"], totals(body)))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(seen) >= 4, timeout_s=120, what="the readers were answered")
    published = ctr_cli(lake, "views", "publish", "ctr", "2", "--reason", "drop unclassified")
    # One answer more than there are readers: at least one asked after the publish.
    after = len(seen) + len(threads) + 1
    wait_until(lambda: len(seen) >= after, timeout_s=120, what="answers after the publish")
    stop.set()
    for thread in threads:
        thread.join()
    assert published.returncode == 0, published.stdout + published.stderr
    assert {version for version, _ in seen} == {1, 2}
    assert all(found == TOTALS[version] for version, found in seen), set(seen)


@pytest.mark.timeout(900)
def test_build_diff_publish_rollback_and_as_of(
    versioned: LakeSettings, client: httpx.Client
) -> None:
    lake = versioned
    check_diff(lake)
    listed = ctr_cli(lake, "views", "list")
    assert listed.returncode == 0, listed.stderr
    output = listed.stdout + listed.stderr  # the console writes to stderr
    assert "ready" in output
    assert "published" in output

    # v1 serves; v2 can be queried before it is published.
    before = answer(client)
    assert before["view"] == {"name": "ctr", "version": 1}
    assert totals(before) == TOTALS[1]
    preview = answer(client, version="2")
    assert preview["view"] == {"name": "ctr", "version": 2}
    assert totals(preview) == TOTALS[2]
    bad = client.get("/api/v1/ctr", params={**RANGE, "version": "7"})
    assert (bad.status_code, bad.json()["parameter"]) == (400, "version")
    v1_moment = dt.datetime.now(dt.UTC)  # before the publish, a CLI process started after it

    publish_while_reading(client, lake)
    after = answer(client)
    assert after["view"] == {"name": "ctr", "version": 2}
    assert after["rows"] == preview["rows"]
    v2_moment = dt.datetime.now(dt.UTC)  # after the publish, before the rollback's process

    # The SQL sandbox follows the registry too, and keeps every version at hand.
    sql = client.post(
        "/api/v1/sql",
        json={
            "sql": "SELECT (SELECT sum(impressions) FROM ctr), (SELECT sum(impressions) "
            "FROM ctr_v1), (SELECT sum(impressions) FROM ctr_v2)"
        },
    )
    assert sql.status_code == 200, sql.text
    assert sql.json()["rows"] == [[5, 9, 5]]

    # Rollback: v1's answers, exactly.
    rolled = ctr_cli(lake, "views", "rollback", "ctr", "--reason", "dashboards moved")
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert answer(client)["rows"] == before["rows"]
    events = [(e.version, e.event) for e in read_registry(lake).history("ctr")]
    assert events == [(2, "building"), (2, "ready"), (2, "published"), (1, "published")]

    # As of an earlier moment: what the API answered then, although the registry has changed.
    assert answer(client, as_of=v1_moment.isoformat())["rows"] == before["rows"]
    then = answer(client, as_of=v2_moment.isoformat())
    assert then["view"] == {"name": "ctr", "version": 2}
    assert then["rows"] == after["rows"]


def test_publishing_a_version_that_has_not_caught_up_is_refused(
    spark: SparkSession, lake: LakeSettings
) -> None:
    archive(spark, lake, EVENTS)
    batch_layer.job.run(spark, Interval(T0, T0 + dt.timedelta(hours=1)), lake=lake)
    refused = ctr_cli(lake, "views", "publish", "ctr", "2", "--reason", "too early")
    assert refused.returncode == 1
    assert "does not cover 1 interval(s)" in refused.stdout + refused.stderr
    assert read_registry(lake).published("ctr") == V1
    nothing = ctr_cli(lake, "views", "rollback", "ctr", "--reason", "nothing to undo")
    assert nothing.returncode == 1
    assert "nothing to roll back to" in nothing.stdout + nothing.stderr


def test_a_backfill_preview_shows_the_change_and_replaces_nothing(
    spark: SparkSession, lake: LakeSettings
) -> None:
    from deltalake import DeltaTable

    from batch_layer.preview import preview

    hour = Interval(T0, T0 + dt.timedelta(hours=1))
    archive(spark, lake, EVENTS[:6])
    batch_layer.job.run(spark, hour, lake=lake)
    before = DeltaTable(lake.table("batch/ctr")).version()
    # Two more events for 08:05 (desktop) arrive: the recompute would add them to that row.
    archive(
        spark,
        lake,
        [
            device_event(21, "impression", at(5.1), "desktop"),
            device_event(22, "click", at(5.2), "desktop"),
        ],
    )
    result = preview(spark, hour, lake=lake, definition=V1)
    assert (result.rows_compared, result.rows_changed) == (5, 1)
    assert result.impressions == (4, 5)
    assert result.clicks == (2, 3)
    assert (result.only_in_a, result.only_in_b) == (0, 0)
    [change] = result.largest
    assert (
        change.bucket_start,
        change.dimensions["device_type"],
        change.impressions,
        change.clicks,
    ) == (at(5), "desktop", (1, 2), (1, 2))
    assert DeltaTable(lake.table("batch/ctr")).version() == before


@pytest.mark.timeout(600)
def test_a_kappa_build_replays_the_log_into_the_same_rows(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    from deltalake import DeltaTable

    from master_dataset.archiver import run as archive_topic
    from master_dataset.settings import ArchiverSettings
    from tests.support.events import send, wire_event
    from workflows.build import replay_and_build

    wire = [
        {**wire_event(str(e["event_id"]), str(e["event_type"]), e["event_time"]),  # type: ignore[arg-type]
         "device_type": e["device_type"]}
        for e in EVENTS
    ]  # fmt: skip
    send(topics, *wire, wire[0])  # one duplicate: exactly once in the view all the same
    archive_topic(spark, kafka=topics, lake=lake, settings=ArchiverSettings(), available_now=True)
    for hour in Interval(T0, T0 + dt.timedelta(hours=2)).hours():
        batch_layer.job.run(spark, hour, lake=lake)
    master_version = DeltaTable(MASTER_EVENTS.path(lake)).version()

    plan, runs = replay_and_build(spark, lake, topics, V2)
    assert (len(plan.intervals), plan.outside) == (2, ())
    assert len(runs) == 2
    rows = DeltaTable(lake.table("batch/ctr_v2")).to_pyarrow_table().to_pylist()
    assert sum(r["impressions"] for r in rows) == TOTALS[2][0]
    assert sum(r["clicks"] for r in rows) == TOTALS[2][1]
    assert {r["device_type"] for r in rows} == {"mobile", "desktop", "tablet"}
    coverage = DeltaTable(lake.table("batch/coverage")).to_pyarrow_table().to_pylist()
    assert {c["input_version"] for c in coverage if c["view"] == "ctr@v2"} == {master_version}
    assert read_registry(lake).state("ctr", 2) == "ready"
    # The replay kept its own checkpoint and tables; master/events was not touched.
    assert DeltaTable(MASTER_EVENTS.path(lake)).version() == master_version
