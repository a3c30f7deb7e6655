"""Exact means exact, end to end on the real broker, Spark and Delta: a burst of events six hours
late for an hour a batch run already covered is never served as exact, is served with the late
events added until `ctr batch --stale` recomputes it, and is exact again afterwards; and the
drift a batch run records equals the duplicates the speed layer counted and the late events it
dropped."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import httpx
import pytest
from deltalake import DeltaTable
from pydantic import SecretStr
from pyspark.sql import SparkSession

import batch_layer.job
from api.settings import ApiSettings
from batch_layer.interval import Interval
from lake.arrivals import arrivals_table, forget_counted
from lake.settings import LakeSettings
from master_dataset.archiver import run as archive
from master_dataset.settings import ArchiverSettings
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import StreamProgress
from speed_layer.job import run as run_speed
from speed_layer.settings import SpeedSettings
from tests.support import lake_writer
from tests.support.api_server import running_api
from tests.support.events import send, wire_event
from tests.support.waiting import wait_until

CTR = str(Path(sys.executable).with_name("ctr"))
TOKEN = "test-token-0123456789"
# An hour that ended six hours ago: the late burst arrives six hours after its events.
HOUR = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=7)


def at(minutes: float) -> dt.datetime:
    return HOUR + dt.timedelta(minutes=minutes)


def traffic(prefix: str, n: int, duplicates: int) -> list[dict[str, object]]:
    """``n`` events over the hour (every third a click, two ads), then ``duplicates`` resent."""
    events = [
        wire_event(
            f"{prefix}{i}",
            "click" if i % 3 == 0 else "impression",
            at(i % 50 + 0.5),
            ad=f"ad-{i % 2}",
        )
        for i in range(n)
    ]
    return events + events[:duplicates]


def minute_of(event: dict[str, object]) -> str:
    """The event's minute bucket, HH:MM (UTC)."""
    millis = cast(int, event["event_time"])
    return dt.datetime.fromtimestamp(millis / 1000, dt.UTC).strftime("%H:%M")


def truth(events: Sequence[dict[str, object]]) -> dict[str, tuple[int, int]]:
    """Exact impressions and clicks per minute (HH:MM): one count per event id."""
    unique = {e["event_id"]: e for e in events}.values()
    counts: Counter[tuple[str, str]] = Counter()
    for e in unique:
        counts[(minute_of(e), str(e["event_type"]))] += 1
    minutes = sorted({m for m, _ in counts})
    return {m: (counts[(m, "impression")], counts[(m, "click")]) for m in minutes}


def served(client: httpx.Client) -> dict[str, tuple[int, int, str, int]]:
    response = client.get(
        "/api/v1/ctr",
        params={
            "start": HOUR.isoformat(),
            "end": (HOUR + dt.timedelta(hours=1)).isoformat(),
            "granularity": "minute",
        },
    )
    assert response.status_code == 200, response.text
    return {
        r["bucket_start"][11:16]: (r["impressions"], r["clicks"], r["source"], r["stale_events"])
        for r in response.json()["rows"]
    }


@pytest.fixture
def client(lake: LakeSettings) -> Iterator[httpx.Client]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with (
        running_api(settings, lake) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        yield client


def ctr_batch_stale(lake: LakeSettings, kafka_env: dict[str, str]) -> str:
    env = {
        **kafka_env,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
    }
    env.update(SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS="2", COLUMNS="200")
    done = subprocess.run(
        [CTR, "batch", "--stale"], env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout + done.stderr  # the console reports on stderr


@pytest.mark.timeout(900)
def test_a_late_burst_is_never_served_as_exact_until_recomputed(
    spark: SparkSession,
    topics: KafkaSettings,
    lake: LakeSettings,
    client: httpx.Client,
    kafka_env: dict[str, str],
) -> None:
    settings = ArchiverSettings()
    on_time = traffic("a", 60, duplicates=5)
    send(topics, *on_time)
    archive(spark, kafka=topics, lake=lake, settings=settings, available_now=True)
    batch_layer.job.run(spark, Interval(HOUR, HOUR + dt.timedelta(hours=1)), lake=lake)
    before = truth(on_time)
    assert served(client) == {m: (i, c, "batch", 0) for m, (i, c) in before.items()}
    assert "nothing is stale" in ctr_batch_stale(lake, kafka_env)

    # Six hours late: 40 more events for the covered hour, 3 of them sent twice.
    burst = traffic("late", 40, duplicates=3)
    send(topics, *burst)
    archive(spark, kafka=topics, lake=lake, settings=settings, available_now=True)
    after = truth([*on_time, *burst])
    late: Counter[tuple[str, object]] = Counter()
    for e in burst:  # the burst as archived: its duplicates too (an approximation until recompute)
        late[(minute_of(e), e["event_type"])] += 1
    stale = served(client)
    for m, (impressions, clicks, source, stale_events) in stale.items():
        added = (late[(m, "impression")], late[(m, "click")])
        old = before.get(m, (0, 0))
        assert (impressions, clicks) == (old[0] + added[0], old[1] + added[1]), m
        if sum(added):
            assert (source, stale_events) == ("stale", sum(added)), m
        else:
            assert (source, stale_events) == ("batch", 0), m
    assert set(stale) == set(after)
    [view] = client.get("/api/v1/views").json()["views"]
    assert sum(i["events"] for i in view["stale_intervals"]) == len(burst)

    output = ctr_batch_stale(lake, kafka_env)
    assert "recomputing 1 interval(s)" in output, output
    assert served(client) == {m: (i, c, "batch", 0) for m, (i, c) in after.items()}
    assert client.get("/api/v1/views").json()["views"][0]["stale_intervals"] == []
    assert "nothing is stale" in ctr_batch_stale(lake, kafka_env)


@pytest.mark.timeout(600)
def test_drift_equals_the_injected_duplicates_and_the_dropped_late_events(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    t0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)

    def t(minutes: float) -> dt.datetime:
        return t0 + dt.timedelta(minutes=minutes)

    # Batch 0 sees 10:30: the speed job's watermark moves to 10:20 (10 minutes of delay).
    # In 10:03, one impression resent once and one click resent twice: speed counts them all.
    impression, click = wire_event("d1", "impression", t(3.2)), wire_event("d2", "click", t(3.4))
    send(topics, wire_event("n1", "impression", t(30)), impression, click, impression, click, click)
    # After it: an impression and a click for 10:05, later than the watermark (dropped), and
    # one on time.
    later = [
        wire_event("l1", "impression", t(5)),
        wire_event("l2", "click", t(5.5)),
        wire_event("o1", "impression", t(20.1)),
    ]
    sent_later = False

    def after_batch(progress: StreamProgress) -> None:
        nonlocal sent_later
        if not sent_later and progress.input_rows:
            send(topics, *later)
            sent_later = True

    def speed_saw_everything() -> bool:
        """All 9 records counted (speed/ctr) or dropped as late (speed/late)."""
        if not sent_later:
            return False
        seen = 0
        for table in ("speed/ctr", "speed/late"):
            if DeltaTable.is_deltatable(lake.table(table)):
                rows = DeltaTable(lake.table(table)).to_pyarrow_table(
                    columns=["impressions", "clicks"]
                )
                seen += sum(rows.column("impressions").to_pylist())
                seen += sum(rows.column("clicks").to_pylist())
        return seen >= 9

    run_speed(
        spark,
        kafka=topics,
        lake=lake,
        settings=SpeedSettings(trigger_seconds=0.5),
        on_progress=after_batch,
        should_stop=speed_saw_everything,
    )
    archive(spark, kafka=topics, lake=lake, settings=ArchiverSettings(), available_now=True)
    batch_layer.job.run(
        spark, Interval(t0, t0 + dt.timedelta(hours=1)), lake=lake, run_id="drift-run"
    )

    drift = DeltaTable(lake.table("batch/drift")).to_pyarrow_table().to_pylist()
    assert sorted(
        (
            r["bucket_start"],
            r["speed_impressions"],
            r["speed_clicks"],
            r["batch_impressions"],
            r["batch_clicks"],
        )
        for r in drift
    ) == [
        (t(3), 2, 3, 1, 1),  # +1 impression, +2 clicks: the duplicates
        (t(5), 0, 0, 1, 1),  # -1, -1: the events later than the watermark
        (t(20), 1, 0, 1, 0),
        (t(30), 1, 0, 1, 0),
    ]
    assert {r["run_id"] for r in drift} == {"drift-run"}

    # Covered now: a rerun of the interval records no drift again.
    batch_layer.job.run(spark, Interval(t0, t0 + dt.timedelta(hours=1)), lake=lake)
    assert DeltaTable(lake.table("batch/drift")).to_pyarrow_table().num_rows == 4


def test_the_arrivals_clean_up_survives_the_archivers_appends(lake: LakeSettings) -> None:
    # Counted arrivals (version 1) and the archiver appending newer ones (version 2 and up)
    # every few milliseconds through its own writer while the batch job deletes what it
    # counted: the clean-up must neither fail the run nor delete the newer rows (delta-spark
    # failed such a delete every time; delta-rs's gets through), and the archiver's appends
    # get through the delete's commits (delta-rs refuses an append whose read a concurrent
    # removal overtook: on a busy machine, often).
    counted = [lake_writer.ctr_row(lake_writer.minute(5), 10, 1)]
    lake_writer.write_arrivals(lake, 1, counted)
    stop = threading.Event()
    appended = []
    writer = arrivals_table(lake)

    def archiver() -> None:
        version = 2
        while not stop.is_set():
            rows = lake_writer.arrival_rows(
                lake_writer.ctr_row(lake_writer.minute(6), 1, 0), events_version=version
            )
            writer.append(rows, app_id="test-archiver", version=version)
            appended.append(version)
            version += 1
            stop.wait(0.05)

    since = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
    until = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
    thread = threading.Thread(target=archiver)
    thread.start()
    try:
        wait_until(lambda: len(appended) >= 3, timeout_s=60, what="three appends")
        # Under the appends, the counted rows go and every newer one stays.
        assert forget_counted(lake, start=since, end=until, input_version=1, attempts=2)
    finally:
        stop.set()
        thread.join()
    versions = (
        DeltaTable(str(lake.table("master/arrivals")))
        .to_pyarrow_table(columns=["events_version"])["events_version"]
        .to_pylist()
    )
    assert sorted(versions) == appended
