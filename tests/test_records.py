"""Kafka records to master-dataset rows: the reference time of the far-future check."""

from __future__ import annotations

import time

import orjson
import pyarrow as pa

from events.records import parse_batch

YEAR_MS = 365 * 86_400_000


def _event(event_time_ms: int, n: int) -> bytes:
    return orjson.dumps(
        {
            "event_id": f"e{n}",
            "event_type": "impression",
            "event_time": event_time_ms,
            "impression_id": f"i{n}",
            "ad_id": "ad-001-01",
            "campaign_id": "cmp-001",
            "site_id": "site-0001",
            "country": "US",
            "device_type": "mobile",
            "user_id": "u1",
            "schema_version": 1,
        }
    )


def _kafka_batch(records: list[tuple[bytes, int | None]]) -> pa.RecordBatch:
    """value and record timestamp (ms, or null) -> a batch shaped like the Kafka source's."""
    n = len(records)
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array([v for v, _ in records], pa.binary()),
            "topic": pa.array(["ad-events"] * n),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array(
                [None if s is None else s * 1000 for _, s in records], pa.timestamp("us", tz="UTC")
            ),
            "timestampType": pa.array([0] * n, pa.int32()),
        }
    )


def test_a_future_record_timestamp_does_not_admit_future_events() -> None:
    now = int(time.time() * 1000)
    year_3000 = 32_503_680_000_000
    parsed = parse_batch(
        _kafka_batch(
            [
                (_event(year_3000, 0), year_3000),  # producer clock (or forger) in year 3000
                (_event(now, 1), year_3000),  # a good event with a bad record timestamp
                (_event(now - YEAR_MS, 2), now),  # a year old: late, but valid
                (_event(now, 3), None),  # no usable record timestamp
            ]
        )
    ).to_pylist()
    reasons = [row["reason"] for row in parsed]
    assert reasons[0] is not None
    assert "in the future" in reasons[0]
    assert reasons[1:] == [None, None, None]
    assert [row["event_id"] for row in parsed[1:]] == ["e1", "e2", "e3"]


def test_the_record_timestamp_is_the_reference_when_it_is_in_the_past() -> None:
    """Replaying a record later gives the same verdict: the reference is its own timestamp."""
    long_ago = int(time.time() * 1000) - 10 * YEAR_MS
    parsed = parse_batch(_kafka_batch([(_event(long_ago + 2 * 3_600_000, 0), long_ago)]))
    [reason] = parsed.column("reason").to_pylist()
    assert reason is not None
    assert "in the future" in reason
