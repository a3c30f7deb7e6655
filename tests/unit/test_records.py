"""Kafka records to master-dataset rows: the reference time of the far-future check."""

from __future__ import annotations

import datetime as dt
import time

import orjson
import pyarrow as pa

from events.records import EVENTS_SCHEMA, PARSED_SCHEMA, REJECTED_SCHEMA, parse, parse_batch

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
    parsed = parse(
        _kafka_batch(
            [
                (_event(year_3000, 0), year_3000),  # producer clock (or forger) in year 3000
                (_event(now, 1), year_3000),  # a good event with a bad record timestamp
                (_event(now - YEAR_MS, 2), now),  # a year old: late, but valid
                (_event(now, 3), None),  # no usable record timestamp
            ]
        )
    )
    [refused] = parsed.rejected.to_pylist()
    assert "in the future" in refused["reason"]
    assert (refused["kafka_offset"], refused["value"]) == (0, _event(year_3000, 0))
    assert parsed.events.column("event_id").to_pylist() == ["e1", "e2", "e3"]
    assert parsed.events.column("kafka_offset").to_pylist() == [1, 2, 3]


def test_the_record_timestamp_is_the_reference_when_it_is_in_the_past() -> None:
    """Replaying a record later gives the same verdict: the reference is its own timestamp."""
    long_ago = int(time.time() * 1000) - 10 * YEAR_MS
    parsed = parse(_kafka_batch([(_event(long_ago + 2 * 3_600_000, 0), long_ago)]))
    [reason] = parsed.rejected.column("reason").to_pylist()
    assert "in the future" in reason
    assert parsed.events.num_rows == 0


def test_records_become_master_dataset_rows_in_their_order() -> None:
    """Valid events with their Kafka coordinates, event_date from event_time; refused records
    (null values too) untouched with the reason; each table in the records' order."""
    at = 1_764_201_600_000 + 90_061_001  # 2025-11-28T01:01:01.001Z
    batch = _kafka_batch(
        [(_event(at, 0), at), (b"{", at), (None, at), (_event(at + 1, 3), None)]  # type: ignore[list-item]
    )
    parsed = parse(batch, now_ms=at + 10_000)
    assert parsed.events.schema == EVENTS_SCHEMA
    assert parsed.rejected.schema == REJECTED_SCHEMA
    first, second = parsed.events.to_pylist()
    assert first["event_time"] == dt.datetime(2025, 11, 28, 1, 1, 1, 1000, tzinfo=dt.UTC)
    assert first["event_date"] == dt.date(2025, 11, 28)
    assert (first["kafka_partition"], first["kafka_offset"]) == (0, 0)
    assert first["ingest_time"] == dt.datetime.fromtimestamp(at / 1000, dt.UTC)
    assert (second["event_id"], second["kafka_offset"], second["ingest_time"]) == ("e3", 3, None)
    assert [(r["kafka_offset"], r["value"], r["reason"]) for r in parsed.rejected.to_pylist()] == [
        (1, b"{", "record: not valid JSON (unexpected end of data at byte 1)"),
        (2, None, "record: no value (a null Kafka record)"),
    ]


def test_the_speed_jobs_form_holds_both_kinds_with_the_reason() -> None:
    now = int(time.time() * 1000)
    parsed = parse_batch(_kafka_batch([(b"[]", now), (_event(now, 1), now)]))
    assert parsed.schema == PARSED_SCHEMA
    rows = {r["kafka_offset"]: r for r in parsed.to_pylist()}
    assert (rows[1]["event_id"], rows[1]["reason"]) == ("e1", None)
    assert (rows[0]["event_id"], rows[0]["reason"]) == (
        None,
        "record: expected a JSON object, got array",
    )
