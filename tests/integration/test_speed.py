"""The speed layer against the real broker, Spark and Delta: exact when the input is clean,
inflated by exactly the duplicates, late events dropped and counted, no double counting
through SIGKILLs and restarts."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pytest
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

import batch_layer.job
import speed_layer.tasks
from events.model import Event, validate
from lake.settings import LakeSettings
from lake.speed_status import read_status, speed_status_path
from runtime.kafka_settings import KafkaSettings
from runtime.stream_metrics import StreamMetrics
from runtime.streaming import Periodic, StreamProgress
from speed_layer.job import SpeedStateError, reset, run
from speed_layer.settings import SpeedSettings
from speed_layer.tables import sum_per_key
from tests.support import faults
from tests.support.consume import read_topic
from tests.support.events import send
from tests.support.events import wire_event as event
from views import sketches
from views.columns import DIMENSIONS, SKETCHES
from views.ctr import ctr as the_view
from views.ctr import ctr_arrow as the_view_in_arrow

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
SETTINGS = SpeedSettings(trigger_seconds=0.5)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def speed_rows(lake: LakeSettings) -> list[tuple[dt.datetime, str, int, int]]:
    """(bucket, ad, impressions, clicks), the partial counts of speed/ctr summed per key."""
    table = sum_per_key(DeltaTable(lake.table("speed/ctr")).to_pyarrow_table())
    return sorted(
        (r["bucket_start"], r["ad_id"], r["impressions"], r["clicks"]) for r in table.to_pylist()
    )


def late_rows(lake: LakeSettings) -> dict[dt.datetime, tuple[int, int]]:
    path = lake.table("speed/late")
    if not DeltaTable.is_deltatable(path):
        return {}
    totals: dict[dt.datetime, tuple[int, int]] = {}
    for r in DeltaTable(path).to_pyarrow_table().to_pylist():
        impressions, clicks = totals.get(r["bucket_start"], (0, 0))
        totals[r["bucket_start"]] = (impressions + r["impressions"], clicks + r["clicks"])
    return totals


def run_until_caught_up(
    spark: SparkSession,
    topics: KafkaSettings,
    lake: LakeSettings,
    settings: SpeedSettings = SETTINGS,
) -> int:
    return run(spark, kafka=topics, lake=lake, settings=settings, available_now=True)


def test_clean_input_gives_exact_counts(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    send(
        topics,
        event("e1", "impression", at(0.1)),
        event("e2", "impression", at(0.9)),
        event("e3", "click", at(0.95)),
        event("e4", "impression", at(1.2), ad="ad-2"),
        event("e5", "click", at(1.5), ad="ad-2"),
        event("e6", "click", at(1.6), ad="ad-2"),
        raw=b"{not json",
    )
    assert run_until_caught_up(spark, topics, lake) == 7
    assert speed_rows(lake) == [(at(0), "ad-1", 2, 1), (at(1), "ad-2", 1, 2)]
    assert late_rows(lake) == {}
    status = read_status(lake)
    assert status is not None
    assert status["invalid_records"] == 1  # skipped and counted (the archiver keeps it)
    assert status["offsets_behind"] == 0

    # More events for an open bucket are added to it; a rerun with nothing new changes nothing.
    send(topics, event("e7", "impression", at(1.7), ad="ad-2"))
    assert run_until_caught_up(spark, topics, lake) == 1
    assert speed_rows(lake) == [(at(0), "ad-1", 2, 1), (at(1), "ad-2", 2, 2)]
    version = DeltaTable(lake.table("speed/ctr")).version()
    assert run_until_caught_up(spark, topics, lake) == 0
    assert DeltaTable(lake.table("speed/ctr")).version() == version


def test_duplicates_inflate_counts_by_exactly_the_duplicates(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    impression, click = event("d1", "impression", at(3.2)), event("d2", "click", at(3.4))
    send(topics, impression, click, event("d3", "impression", at(3.5)), impression, click, click)
    run_until_caught_up(spark, topics, lake)
    # Exact: 2 impressions, 1 click. Speed: + 1 duplicated impression, + 2 duplicated clicks.
    assert speed_rows(lake) == [(at(3), "ad-1", 3, 3)]


def test_events_later_than_the_watermark_are_dropped_and_counted(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    # Batch 0 sees 10:30, so the next batches run with the watermark at 10:20 (10 minutes).
    send(topics, event("n1", "impression", at(30)))
    late = [
        event("l1", "impression", at(5)),  # bucket 10:05 closed long ago
        event("l2", "click", at(5.5)),
        event("l3", "impression", at(19.5)),  # bucket [10:19, 10:20): closed exactly at 10:20
    ]
    on_time = [event("o1", "impression", at(20.1)), event("o2", "click", at(29))]
    sent_late = False
    reported = 0

    registry = CollectorRegistry()
    metrics = StreamMetrics(registry, "speed")

    def after_batch(progress: StreamProgress) -> None:
        nonlocal sent_late, reported
        metrics.record(progress)
        reported += progress.input_rows
        if not sent_late and progress.input_rows:
            send(topics, *late, *on_time)
            sent_late = True

    # Stop once every batch that wrote the 6 events has also reported its progress.
    seen = run(
        spark,
        kafka=topics,
        lake=lake,
        settings=SETTINGS,
        on_progress=after_batch,
        should_stop=lambda: sent_late and reported >= 6 and _caught_up(lake, 6),
    )
    assert seen == 6
    assert speed_rows(lake) == [
        (at(20), "ad-1", 1, 0),
        (at(29), "ad-1", 0, 1),
        (at(30), "ad-1", 1, 0),
    ]
    assert late_rows(lake) == {at(5): (1, 1), at(19): (1, 0)}
    # Its metrics count what it read, what it dropped as late, and where the watermark is.
    assert registry.get_sample_value("ctr_stream_records_total", {"query": "speed"}) == 6
    assert registry.get_sample_value("ctr_speed_late_events_total") == 3
    watermark = registry.get_sample_value(
        "ctr_stream_watermark_timestamp_seconds", {"query": "speed"}
    )
    assert watermark == at(20).timestamp()


def _caught_up(lake: LakeSettings, events: int) -> bool:
    """Whether speed/ctr and speed/late together account for ``events`` events."""
    if not DeltaTable.is_deltatable(lake.table("speed/ctr")):
        return False
    counted = sum(i + c for _, _, i, c in speed_rows(lake))
    dropped = sum(i + c for i, c in late_rows(lake).values())
    return counted + dropped >= events


def test_speed_and_batch_layers_share_the_one_view_definition(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch job aggregates in Spark, the speed job's tasks in Arrow: one definition in the
    # two forms, which give the same rows on the same events.
    assert vars(batch_layer.job)["ctr"] is the_view
    assert vars(speed_layer.job)["ctr_arrow"] is the_view_in_arrow
    times = [at(m) for m in (0, 0.2, 0.99, 1, 1.5, 59.99)]
    events = pa.table(
        {
            "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
            "event_type": ["impression", "click", "impression", "click", "click", "impression"],
            **{d: [f"{d}-{i % 2}" for i in range(len(times))] for d in DIMENSIONS},
            "user_id": ["u1", "u1", "u2", None, "u2", "u3"],
            # The batch job's events carry their users' numbers too (batch_layer.users).
            "user_no": pa.array([1, 1, 2, None, 2, 3], pa.int32()),
        }
    )
    in_spark = the_view(spark.createDataFrame(events.to_pandas()), reach=True).toArrow()
    on_driver = the_view_in_arrow(events, reach=True)

    def rows(table: pa.Table) -> list[tuple[object, ...]]:
        names = ["bucket_start", *DIMENSIONS, "impressions", "clicks"]
        return sorted(
            (
                *(r[n] for n in names),
                *(round(sketches.union([r[s]]).value, 6) for s in SKETCHES),
            )
            for r in table.to_pylist()
        )

    assert rows(in_spark) == rows(on_driver)
    assert len(rows(on_driver)) == 5
    # Minute 0: u1's and u2's impressions (dimensions -0), u1's click (-1); minute 1: u2's
    # click (-0), and a click without a user, who is no user (-1).
    assert [r[-2:] for r in rows(on_driver)[:4]] == [(2.0, 0.0), (0.0, 1.0), (0.0, 1.0), (0.0, 0.0)]

    # speed/ctr holds what the view function returns: a view that adds 100 to every click
    # count shows in it, which no aggregation of the speed job's own would.
    def marked_view(events: pa.Table, *, reach: bool = False) -> pa.Table:
        view = the_view_in_arrow(events, reach=reach)
        return view.set_column(
            view.schema.get_field_index("clicks"),
            "clicks",
            pa.compute.add(view.column("clicks"), 100),
        )

    monkeypatch.setattr(speed_layer.job, "ctr_arrow", marked_view)
    # (One Kafka key, so one task: each task writes its own partial counts.)
    click = {**event("v2", "click", at(50.5)), "impression_id": "i-v1"}
    send(topics, event("v1", "impression", at(50)), click)
    run_until_caught_up(spark, topics, lake)
    assert speed_rows(lake) == [(at(50), "ad-1", 1, 101)]


def attribution_rows(lake: LakeSettings) -> list[tuple[dt.datetime, int, int, int, int, int]]:
    """(bucket, impressions, clicks, attributed, orphan, repeat) of speed/ctr summed per key
    (one ad)."""
    table = sum_per_key(DeltaTable(lake.table("speed/ctr")).to_pyarrow_table())
    measures = ("impressions", "clicks", "attributed_clicks", "orphan_clicks", "repeat_clicks")
    return sorted((r["bucket_start"], *(r[m] for m in measures)) for r in table.to_pylist())


def test_clicks_are_attributed_to_their_impressions_in_the_impressions_bucket(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    def click(event_id: str, when: dt.datetime, impression: str) -> dict[str, object]:
        return {**event(event_id, "click", when), "impression_id": impression}

    send(
        topics,
        event("a1", "impression", at(60.1)),
        event("a2", "impression", at(60.5)),
        click("a3", at(61.2), "i-a1"),
        click("a4", at(61.5), "i-a1"),  # a repeat
        click("a5", at(61.7), "i-unseen"),  # an orphan
    )
    run_until_caught_up(spark, topics, lake)
    assert attribution_rows(lake) == [
        (at(60), 2, 0, 1, 0, 1),  # the impressions' bucket: one clicked, clicked twice
        (at(61), 0, 3, 0, 1, 0),  # the clicks' bucket: every click event, one orphan
    ]
    # A restart keeps the impressions seen before it (their partition's state, beside the
    # checkpoint), even in a Python worker that never saw them: a click on a2 is attributed.
    send(topics, click("a6", at(61.9), "i-a2"))
    run_until_caught_up(spark, topics, lake)
    assert attribution_rows(lake) == [(at(60), 2, 0, 2, 0, 1), (at(61), 0, 4, 0, 1, 0)]


def test_split_late_closes_buckets_the_watermark_has_passed() -> None:
    ts = pa.timestamp("us", tz="UTC")
    view = pa.table(
        {
            "bucket_start": pa.array([at(8), at(9), at(9), at(10)], ts),
            "ad_id": ["a", "a", "b", "a"],
            "impressions": pa.array([1, 2, 3, 4], pa.int64()),
            "clicks": pa.array([0, 1, 1, 0], pa.int64()),
        }
    )
    open_rows, late = speed_layer.tasks.split_late(view, int(at(10).timestamp() * 1000))
    assert open_rows.column("impressions").to_pylist() == [4]
    assert late.to_pylist() == [
        {"bucket_start": at(8), "impressions": 1, "clicks": 0},
        {"bucket_start": at(9), "impressions": 5, "clicks": 2},
    ]
    everything, nothing = speed_layer.tasks.split_late(view, 0)  # no watermark yet
    assert everything.num_rows == 4
    assert nothing.num_rows == 0


def test_maintenance_comes_a_minute_after_a_restart_then_every_period() -> None:
    """A job killed more often than its maintenance period still maintains its tables."""
    now = [1000.0]
    due = Periodic(300, first_after_s=60, clock=lambda: now[0])
    seen = []
    for _ in range(10):  # 0, 60, ..., 540 s after the start
        seen.append(due.due())
        now[0] += 60
    assert [i * 60 for i, d in enumerate(seen) if d] == [60, 360]
    assert Periodic(300, clock=lambda: now[0]).due() is False  # a whole period first
    assert Periodic(30, first_after_s=60, clock=lambda: 0.0).due() is False  # at most a period


def test_a_lost_checkpoint_is_refused_until_reset(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    send(topics, event("c1", "impression", at(40)))
    run_until_caught_up(spark, topics, lake)
    checkpoint = Path(lake.checkpoint(SETTINGS.checkpoint_name))
    os.rename(checkpoint, checkpoint.with_name("moved"))
    with pytest.raises(SpeedStateError, match="ctr speed --reset"):
        run_until_caught_up(spark, topics, lake)
    reset(lake, SETTINGS)
    assert speed_rows(lake) == []
    run_until_caught_up(spark, topics, lake)  # rebuilt from the retained log
    assert speed_rows(lake) == [(at(40), "ad-1", 1, 0)]


def _exact_counts(topics: KafkaSettings) -> Counter[tuple[object, ...]]:
    counts: Counter[tuple[object, ...]] = Counter()
    for record in read_topic(topics, topics.topic):
        result = validate(record.value, int(time.time() * 1000))
        if isinstance(result, Event):
            bucket = result.event_time // 60_000 * 60_000
            key = (bucket, *(getattr(result, name) for name in DIMENSIONS))
            counts[(*key, result.event_type)] += 1
    return counts


@pytest.mark.faults
@pytest.mark.timeout(faults.timeout(600))
def test_sigkill_and_restart_never_count_a_bucket_twice(
    kafka_env: dict[str, str], topics: KafkaSettings, lake: LakeSettings
) -> None:
    env = faults.job_env(
        kafka_env, lake, SPEED_TRIGGER_SECONDS="0.5", SPEED_MAX_OFFSETS_PER_TRIGGER="700"
    )
    with faults.traffic(topics, seed=8, malformed_fraction=0.02):
        # Spark starts in ~8 s: kill during its start and between micro-batches.
        faults.sigkill_repeatedly("speed", env, kills=3 * faults.ROUNDS, seed=3, alive_s=(10, 20))
    faults.catch_up("speed", {**env, "SPEED_MAX_OFFSETS_PER_TRIGGER": "100000"})

    assert late_rows(lake) == {}  # events in time order, well within the watermark
    expected = _exact_counts(topics)
    table = DeltaTable(lake.table("speed/ctr")).to_pyarrow_table().to_pylist()
    got: Counter[tuple[object, ...]] = Counter()
    for r in table:
        key = (int(r["bucket_start"].timestamp() * 1000), *(r[name] for name in DIMENSIONS))
        got[(*key, "impression")] += r["impressions"]
        got[(*key, "click")] += r["clicks"]
    got = +got  # drop zero counts
    assert sum(expected.values()) > 5000
    assert got == expected
    status = json.loads(Path(speed_status_path(lake)).read_text())
    assert status["offsets_behind"] == 0


@pytest.mark.timeout(600)
def test_a_micro_batch_larger_than_the_drivers_result_limit_is_counted(
    kafka_env: dict[str, str], topics: KafkaSettings, lake: LakeSettings
) -> None:
    """`ctr speed` with spark.driver.maxResultSize at Spark's minimum (1m), one micro-batch of
    40,000 events (several megabytes as Arrow, more as JSON): the events stay in the tasks,
    only the files' descriptions reach the driver."""
    import subprocess
    import sys

    n = 40_000

    def nth(i: int) -> dict[str, object]:
        """Every 7th event a click on the impression just before it (none before the first)."""
        kind = "click" if i % 7 == 0 else "impression"
        wire = event(f"m{i}", kind, at(70 + 2 * i / n), ad=f"ad-{i % 997}")
        named = f"i-m{i - 1}" if kind == "click" else wire["impression_id"]
        return {
            **wire,
            "site_id": f"site-{i % 13}",
            "user_id": f"u-{i:08d}",
            "impression_id": named,
        }

    events = [nth(i) for i in range(n)]
    send(topics, *events)
    env = {
        **os.environ,
        **faults.job_env(kafka_env, lake, SPEED_MAX_OFFSETS_PER_TRIGGER="100000"),
        "SPARK_MASTER": "local[2]",
        "SPARK_CONF": json.dumps({"spark.driver.maxResultSize": "1m"}),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ctr")), "speed", "--available-now"],
        env=env, capture_output=True, text=True, timeout=500, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = speed_rows(lake)
    assert sum(i + c for _, _, i, c in rows) == n
    status = read_status(lake)
    assert status is not None
    phases = status["phases_ms"]
    assert phases["events"] == n  # one micro-batch
    assert phases["result_bytes"] < 64 * 1024  # the answers of a few tasks
    # Every click but the first names the impression just before it (same key, so the same
    # partition and task): attributed; the first is an orphan.
    measures = DeltaTable(lake.table("speed/ctr")).to_pyarrow_table()
    assert pyarrow.compute.sum(measures["attributed_clicks"]).as_py() == n // 7
    assert pyarrow.compute.sum(measures["orphan_clicks"]).as_py() == 1


def test_the_job_rolls_up_closed_minutes_in_spark_tasks(
    spark: SparkSession, topics: KafkaSettings, lake: LakeSettings
) -> None:
    """With a roll-up due at every micro-batch, the files whose minutes the watermark closed are
    summed per key by Spark tasks and swapped in by the driver without changing the data (a
    closed minute may keep a row per roll-up that took one of its files), and every count stays."""
    events = [
        event(f"r{m}-{k}", "impression", at(100 + m + k / 10)) for m in range(14) for k in range(6)
    ]
    send(topics, *events)
    settings = SpeedSettings(max_offsets_per_trigger=12, rollup_seconds=0.001)
    assert run_until_caught_up(spark, topics, lake, settings) == len(events)
    table = DeltaTable(lake.table("speed/ctr"))
    stored = table.to_pyarrow_table()
    assert sum(stored.column("impressions").to_pylist()) == len(events)
    assert speed_rows(lake) == [(at(100 + m), "ad-1", 6, 0) for m in range(14)]
    assert [c for c in table.history() if c.get("ctr.rolledUpBefore")]
    actions = [
        json.loads(line)
        for entry in sorted(Path(lake.table("speed/ctr"), "_delta_log").glob("*.json"))
        for line in entry.read_text().splitlines()
    ]
    removes = [a["remove"] for a in actions if "remove" in a]
    rewritten = [a["add"] for a in actions if "add" in a and not a["add"]["dataChange"]]
    assert rewritten  # the roll-ups' files
    assert removes
    assert not any(r["dataChange"] for r in removes)
