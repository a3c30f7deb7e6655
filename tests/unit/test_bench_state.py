"""The attribution-state benchmark's pure parts: the key-by-key rule Spark's state runs equals
the speed layer's vectorised attribution on any stream of micro-batches; the partitions are
Kafka's (murmur2, checked against the Java client's values); the batches' plan follows the
speed job's watermark rule."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import report
from bench.state import StateBenchSettings
from bench.state_processor import Event, Impression, attribute_key, open_from
from bench.state_traffic import kafka_partitions, murmur2, write_batches
from speed_layer.attribution import BUCKET_MS, EVENTS_SCHEMA, MEASURES, Attribution
from views.columns import DIMENSIONS

T0 = int(dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.UTC).timestamp() * 1000)
WINDOW = dt.timedelta(minutes=2)
WINDOW_MS = 120_000
# (open-from minute, [(impression id, "impression" | "click", minute after T0)])
Batch = tuple[int, list[tuple[int, str, float]]]


def _ms(minutes: float) -> int:
    return T0 + round(minutes * 60_000)


def _ad(impression: int) -> str:
    return f"ad-{impression % 3}"


def _ours(batches: list[Batch]) -> Counter[tuple[int, str, str]]:
    """(bucket, ad, measure) -> count, by speed_layer.attribution."""
    attribution = Attribution(WINDOW)
    found: Counter[tuple[int, str, str]] = Counter()
    for start, events in batches:
        table = pa.Table.from_pylist(
            [
                {
                    **{d: "x" for d in DIMENSIONS},
                    "impression": i,
                    "event_type": kind,
                    "event_ms": _ms(m),
                    "ad_id": _ad(i),
                }
                for i, kind, m in events
            ],
            schema=EVENTS_SCHEMA,
        )
        for row in attribution.process(table, _ms(start)).to_pylist():
            bucket = int(row["bucket_start"].timestamp() * 1000)
            for measure in MEASURES:
                found[(bucket, row["ad_id"], measure)] += row[measure]
    return +found


def _keyed(batches: list[Batch]) -> Counter[tuple[int, str, str]]:
    """The same by bench.state_processor.attribute_key, key by key, with Spark's timers."""
    stored: dict[int, Impression] = {}
    found: Counter[tuple[int, str, str]] = Counter()
    ad_at = DIMENSIONS.index("ad_id")
    for start, events in batches:
        per_key: dict[int, list[Event]] = {}
        for i, kind, m in events:
            dims = tuple(_ad(i) if d == "ad_id" else "x" for d in DIMENSIONS)
            per_key.setdefault(i, []).append(Event(kind, _ms(m), dims))
        for key, rows in per_key.items():
            outcome = attribute_key(stored.get(key), rows, _ms(start), WINDOW_MS)
            if outcome.state is not None:
                stored[key] = outcome.state
            for bucket, *rest in outcome.rows:
                ad, measures = rest[ad_at], rest[len(DIMENSIONS) :]
                for measure, count in zip(MEASURES, measures, strict=True):
                    found[(bucket, ad, measure)] += count
        # The timers fire after the batch's data, for the buckets it closed.
        stored = {k: v for k, v in stored.items() if v.bucket_ms >= _ms(start)}
    return +found


def _event(impression_minute: dict[int, float]) -> st.SearchStrategy[tuple[int, str, float]]:
    ids = st.sampled_from(sorted(impression_minute))
    impressions = ids.map(lambda i: (i, "impression", impression_minute[i]))
    clicks = st.tuples(ids, st.just("click"), st.floats(0, 9).map(lambda m: round(m, 2)))
    return st.one_of(impressions, clicks)


@st.composite
def _streams(draw: st.DrawFn) -> list[Batch]:
    # An impression id has one event time (a resent impression is the same event).
    minutes = draw(
        st.dictionaries(
            st.integers(0, 7), st.floats(0, 8).map(lambda m: round(m, 2)), min_size=1, max_size=6
        )
    )
    starts = sorted(draw(st.lists(st.integers(0, 6), min_size=1, max_size=5)))
    return [(start, draw(st.lists(_event(minutes), max_size=8))) for start in starts]


@settings(max_examples=300, deadline=None)
@given(_streams())
def test_the_keyed_rule_attributes_as_the_speed_layer_does(batches: list[Batch]) -> None:
    assert _keyed(batches) == _ours(batches)


def test_a_click_after_its_impressions_bucket_closed_is_an_orphan_before_the_timer_fires() -> None:
    dims = ("c", "a", "s", "US", "mobile")
    stored = Impression(_ms(0), _ms(0.5), False, dims)
    outcome = attribute_key(stored, [Event("click", _ms(1.5), dims)], _ms(1), 3_600_000)
    assert outcome.rows == [(_ms(1), *dims, 0, 1, 0)]
    assert outcome.state is None  # unchanged: the timer drops it


def test_a_new_impression_replacing_a_closed_one_moves_its_timer() -> None:
    dims = ("c", "a", "s", "US", "mobile")
    stored = Impression(_ms(0), _ms(0.5), True, dims)
    outcome = attribute_key(stored, [Event("impression", _ms(1.2), dims)], _ms(1), 3_600_000)
    assert outcome.state == Impression(_ms(1), _ms(1.2), False, dims)
    assert (outcome.new, outcome.replaced) == (True, _ms(0) + BUCKET_MS - 1)


def test_open_from_is_the_bucket_of_the_watermark() -> None:
    assert open_from(_ms(3.5)) == _ms(3)
    assert open_from(-1) == 0  # no watermark yet: every bucket open


def test_partitions_are_kafkas_murmur2() -> None:
    # Values of org.apache.kafka.common.utils.Utils.murmur2 (kafka-clients 4.1.1).
    keys = ["21", "foobar", "a-little-bit-long-string", "imp-0123456789abcdef01234567", "abc"]
    expected = [-973932308, -790332482, -985981536, 2052957286, 479470107]
    assert murmur2([k.encode() for k in keys]).view("int32").tolist() == expected
    assert kafka_partitions(keys, 6).tolist() == [0, 0, 2, 4, 3]


def test_the_plan_runs_each_batch_under_the_speed_jobs_watermark(tmp_path: Path) -> None:
    delay = 2_000
    plans = write_batches(tmp_path, batches=4, partitions=3, rate=200, watermark_ms=delay)
    for number, plan in enumerate(plans):
        # The newest event time of the batches before, less the delay; none before the first.
        assert plan.watermark_ms == max([0, *(p.newest_ms - delay for p in plans[:number])])
    table = pq.read_table(plans[2].path)
    assert table.num_rows == plans[2].events
    assert set(table["kafka_partition"].to_pylist()) <= {0, 1, 2}
    newest = table["event_time"].cast(pa.int64()).to_pylist()
    assert max(newest) // 1000 == plans[2].newest_ms


def test_the_results_row_reads_both_sides_and_checks_the_cold_start_bound() -> None:
    def ours(objects: int) -> dict[str, Any]:
        return {
            "snapshot_every": 120,
            "batch_ms": {"p50": 40.0, "p95": 60.0},
            "cold_start": {"objects_read_max": objects, "seconds_total": 0.5},
        }

    spark = {
        "phase_ms": {"triggerExecution": {"p50": 9000.0, "p95": 12000.0}},
        "restart": {"first_batch_s": 30.0},
        "checkpoint": {"partitions": {"0/0": {"restore": {"objects": 24}}}},
    }
    result: dict[str, Any] = {
        "rate": 5000, "partitions": 6, "minutes": 60, "spark_minutes": 2,
        "ours": {"snapshots": ours(121), "no_snapshots": ours(660)},
        "spark": {"pandas": spark},
        "spark_state_cost": {"pandas": {"batch_ms": {"p50": 8000.0, "p95": 11000.0}}},
        "correctness": {"equal": True},
    }  # fmt: skip
    row = report.summarize("state", result)
    assert "cold start after 60 min: at most 121 objects per partition" in row.measured
    assert "(without snapshots 660, 0.5 s)" in row.measured
    assert "the state's share p50 8000.0 ms, p95 11000.0 ms" in row.reference
    assert "at most 24 objects per partition" in row.reference
    assert (row.ratio, row.met) == ("183.33", True)
    result["ours"]["snapshots"] = ours(122)
    assert report.summarize("state", result).met is False
    result["ours"]["snapshots"], result["correctness"]["equal"] = ours(121), False
    assert report.summarize("state", result).met is False


def test_the_sizes_come_from_the_environment_and_a_short_run_is_a_smoke_run() -> None:
    full = StateBenchSettings.from_environ({})
    assert (full.minutes, full.spark_minutes, full.partitions, full.rate) == (60, 2, 6, 5000)
    assert (full.watermark_ms, full.modes, full.smoke) == (600_000, ("pandas", "row"), False)
    short = StateBenchSettings.from_environ(
        {"BENCH_STATE_MINUTES": "3", "BENCH_STATE_SPARK_MINUTES": "1", "BENCH_STATE_MODES": "row"}
    )
    assert (short.batches, short.spark_batches, short.modes, short.smoke) == (
        180,
        60,
        ("row",),
        True,
    )
    with pytest.raises(ValueError, match="spark minutes must be in"):
        StateBenchSettings.from_environ(
            {"BENCH_STATE_MINUTES": "1", "BENCH_STATE_SPARK_MINUTES": "2"}
        )
    with pytest.raises(ValueError, match="unknown Spark state modes"):
        StateBenchSettings.from_environ({"BENCH_STATE_MODES": "pandas,arrow"})
