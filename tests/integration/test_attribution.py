"""Version 3 of the view: clicks attributed to their impressions, exact in the batch layer.

Real Spark and Delta tables on disk; the expected counts come from the definition written
again in plain Python (:func:`ingest.ground_truth.attributed`) or by hand."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from batch_layer.interval import Interval
from batch_layer.job import run
from events.model import Event
from ingest.ground_truth import BUCKET_MS, attributed
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.catalog import MASTER_EVENTS
from lake.coverage.staleness import read_stale
from lake.registry import read_registry, start_new_lake
from lake.settings import LakeSettings
from tests.support.events import archive, archived, event
from views.definitions import definition

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
V3 = definition("ctr", 3)
MEASURES = ("impressions", "clicks", "raw_clicks", "orphan_clicks", "repeat_clicks")


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def hour(n: int) -> Interval:
    return Interval(at(60 * n), at(60 * (n + 1)))


def click(event_id: str, when: dt.datetime, impression: str, ad: str = "ad-1") -> dict[str, object]:
    row = event(event_id, "click", when, ad=ad)
    row["impression_id"] = f"i-{impression}"
    return row


def rows(lake: LakeSettings) -> dict[tuple[object, ...], tuple[int, ...]]:
    table = DeltaTable(lake.table("batch/ctr_v3")).to_pyarrow_table().to_pylist()
    return {(r["bucket_start"], r["ad_id"]): tuple(r[m] for m in MEASURES) for r in table}


def test_a_click_counts_once_for_its_impression_in_the_impressions_bucket(
    spark: SparkSession, lake: LakeSettings
) -> None:
    archive(
        spark,
        lake,
        [
            event("a", "impression", at(0.5)),
            click("a1", at(1.2), "a"),  # credited to a, in a's minute
            click("a2", at(3), "a"),  # a repeat
            click("a3", at(3), "a", ad="ad-2"),  # another repeat, whatever the click says
            click("a3", at(3), "a", ad="ad-2") | {"kafka_offset": 7},  # a duplicate: once
            click("z", at(5), "never-shown"),  # an orphan
            event("b", "impression", at(10)),
            click("b0", at(9.9), "b"),  # before its impression: an orphan
            click("b1", at(70.5), "b"),  # past the window: an orphan, in the next hour
            event("c", "impression", at(59.5), ad="ad-2"),
            click("c1", at(60.2), "c", ad="ad-2"),  # the next hour's click, credited to c
        ],
    )
    run(spark, hour(0), lake=lake, definition=V3)
    run(spark, hour(1), lake=lake, definition=V3)
    assert rows(lake) == {
        (at(0), "ad-1"): (1, 1, 0, 0, 2),
        (at(1), "ad-1"): (0, 0, 1, 0, 0),
        (at(3), "ad-1"): (0, 0, 1, 0, 0),
        (at(3), "ad-2"): (0, 0, 1, 0, 0),
        (at(5), "ad-1"): (0, 0, 1, 1, 0),
        (at(9), "ad-1"): (0, 0, 1, 1, 0),
        (at(10), "ad-1"): (1, 0, 0, 0, 0),
        (at(59), "ad-2"): (1, 1, 0, 0, 0),
        (at(60), "ad-2"): (0, 0, 1, 0, 0),
        (at(70), "ad-1"): (0, 0, 1, 1, 0),
    }


def test_a_late_click_makes_its_impressions_bucket_stale_until_recomputed(
    spark: SparkSession, lake: LakeSettings
) -> None:
    archive(spark, lake, [event("a", "impression", at(59.5)), event("b", "impression", at(80))])
    run(spark, hour(0), lake=lake, definition=V3)
    run(spark, hour(1), lake=lake, definition=V3)
    assert read_stale(lake, V3) == []
    # The click arrives after both runs, in the second hour; its impression is in the first.
    archive_arrival(spark, lake, click("a1", at(61), "a"))
    stale = [b.bucket_start for b in read_stale(lake, V3)]
    assert at(59) in stale  # the impression's bucket, in the hour before the click's
    assert at(61) in stale  # the click's own (raw clicks)
    assert read_stale(lake, definition("ctr", 1)) == []  # version 1 never ran here
    run(spark, hour(0), lake=lake, definition=V3)
    run(spark, hour(1), lake=lake, definition=V3)
    assert read_stale(lake, V3) == []
    assert rows(lake)[(at(59), "ad-1")] == (1, 1, 0, 0, 0)
    assert rows(lake)[(at(61), "ad-1")] == (0, 0, 1, 0, 0)


def archive_arrival(spark: SparkSession, lake: LakeSettings, row: dict[str, object]) -> None:
    """Archive ``row`` and record its arrival as the archiver does (master/arrivals)."""
    import pyarrow as pa

    from lake.arrivals import arrival_rows, arrivals_table

    archive(spark, lake, [row])
    version = DeltaTable(MASTER_EVENTS.path(lake)).version()
    counts = pa.table(
        {
            "bucket_start": pa.array(
                [_minute(row["event_time"])],
                pa.timestamp("us", tz="UTC"),
            ),
            **{d: pa.array([row[d]]) for d in ("campaign_id", "ad_id", "site_id", "country")},
            "device_type": pa.array([row["device_type"]]),
            "impressions": pa.array([int(row["event_type"] == "impression")], pa.int64()),
            "clicks": pa.array([int(row["event_type"] == "click")], pa.int64()),
        }
    )
    arrivals = arrival_rows(counts, events_version=version, batch_id=version, archived_at=at(62))
    arrivals_table(lake).append(arrivals, app_id="test-archiver", version=version)


def _minute(value: object) -> dt.datetime:
    assert isinstance(value, dt.datetime)
    return value.replace(second=0, microsecond=0)


def test_batch_equals_the_ground_truth_of_a_generated_stream(
    spark: SparkSession, lake: LakeSettings
) -> None:
    """Repeated, orphan, late and duplicated events; clicks across minutes and hours."""
    config = TrafficConfig(
        seed=33,
        start_ms=int(T0.timestamp() * 1000) - 10 * 60_000,
        events_per_second=2.0,
        campaigns=3,
        ads_per_campaign=2,
        sites=4,
        min_ctr=0.1,
        max_ctr=0.4,
        click_delay_s=(2.0, 900.0),
        duplicate_fraction=0.03,
        late_fraction=0.03,
        late_delay_s=(60.0, 3600.0),
        repeat_click_fraction=0.2,
        orphan_click_fraction=0.1,
    )
    generator = TrafficGenerator(config)
    sent: list[tuple[Event, int]] = []
    for offset, record in zip(range(16_000), generator, strict=False):
        if record.event is not None:
            sent.append((record.event, offset))
    distinct = list({e.event_id: e for e, _ in reversed(sent)}.values())
    archive(spark, lake, [archived(e, offset) for e, offset in sent])
    for n in (0, 1):
        run(spark, hour(n), lake=lake, definition=V3)
    lo, hi = T0.timestamp() * 1000, (T0.timestamp() + 7200) * 1000
    truth = {
        (dt.datetime.fromtimestamp(k[0] / 1000, dt.UTC), *k[1:]): v
        for k, v in attributed(distinct, 3_600_000).items()
        if lo <= k[0] < hi and k[0] % BUCKET_MS == 0
    }
    table = DeltaTable(lake.table("batch/ctr_v3")).to_pyarrow_table().to_pylist()
    got = {
        (
            r["bucket_start"],
            r["campaign_id"],
            r["ad_id"],
            r["site_id"],
            r["country"],
            r["device_type"],
        ): tuple(r[m] for m in MEASURES)
        for r in table
    }
    assert got == truth
    totals = [sum(v[i] for v in truth.values()) for i in range(5)]
    assert all(totals), f"the stream must hold every kind of click: {totals}"
    assert all(v[1] <= v[0] for v in got.values())


@pytest.mark.parametrize("window", [dt.timedelta(minutes=1), dt.timedelta(hours=1)])
def test_the_plain_python_definition_credits_within_the_window(window: dt.timedelta) -> None:
    base = int(T0.timestamp() * 1000)

    def ev(eid: str, kind: str, ms: int, imp: str) -> Event:
        return Event(eid, kind, base + ms, imp, "ad-1", "cmp-1", "s", "US", "mobile", "u", 1)  # type: ignore[arg-type]

    w = int(window.total_seconds() * 1000)
    counts = attributed(
        [ev("i", "impression", 0, "x"), ev("c1", "click", w, "x"), ev("c2", "click", w + 1, "x")],
        w,
    )
    assert sum(v[1] for v in counts.values()) == 1
    assert sum(v[3] for v in counts.values()) == 1


def test_a_new_lake_starts_with_version_3_published_and_an_old_one_keeps_its_version(
    tmp_path: Path, spark: SparkSession
) -> None:
    new = LakeSettings(lake_root=tmp_path / "new", checkpoint_root=tmp_path / "new-cp")
    [first] = start_new_lake(new)
    registry = read_registry(new)
    assert (first.version, registry.published("ctr").version) == (3, 3)
    assert registry.state("ctr", 1) == "not built"  # never built: it holds back no clean-up
    assert registry.live("ctr") == (V3,)
    assert start_new_lake(new) == []  # once

    old = LakeSettings(lake_root=tmp_path / "old", checkpoint_root=tmp_path / "old-cp")
    archive(spark, old, [event("a", "impression", at(0))])
    assert start_new_lake(old) == []
    assert read_registry(old).published("ctr").version == 1
    assert read_registry(old).state("ctr", 3) == "not built"


def test_arrivals_are_forgotten_once_every_bucket_they_reach_is_recomputed(
    spark: SparkSession, lake: LakeSettings
) -> None:
    start_new_lake(lake)  # version 3 alone is live: its runs clean master/arrivals up

    def arrivals() -> list[dt.datetime]:
        table = DeltaTable(lake.table("master/arrivals")).to_pyarrow_table()
        return sorted(table.column("bucket_start").to_pylist())

    archive_arrival(spark, lake, event("a", "impression", at(59.5)))
    run(spark, hour(0), lake=lake, definition=V3)
    assert arrivals() == []
    archive_arrival(spark, lake, click("a1", at(61), "a"))
    run(spark, hour(1), lake=lake, definition=V3)
    # Counted by the run over its own hour, but the hour before it still needs recomputing:
    # the minutes the click may belong to (up to the window before it) where the batch layer
    # has a row of its dimensions: its impression's, 00:59.
    assert arrivals() == [at(61)]
    assert [b.bucket_start for b in read_stale(lake)] == [at(59)]
    run(spark, hour(0), lake=lake, definition=V3)
    assert arrivals() == []
    assert read_stale(lake) == []
    assert rows(lake)[(at(59), "ad-1")] == (1, 1, 0, 0, 0)
