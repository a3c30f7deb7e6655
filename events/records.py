"""Kafka records -> master dataset rows: parsed with the ingest validator, valid or rejected.

The same :func:`events.model.validate` as every producer, with the record's Kafka timestamp as
the reference time, so a record replayed after a crash gets the same verdict. The reference is
never later than the clock at parse time: a producer that stamps its records in the year 3000
(or sets no timestamp) does not get year-3000 events past the far-future check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from events.model import Invalid, validate

EVENTS_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("event_type", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("impression_id", pa.string()),
        ("ad_id", pa.string()),
        ("campaign_id", pa.string()),
        ("site_id", pa.string()),
        ("country", pa.string()),
        ("device_type", pa.string()),
        ("user_id", pa.string()),
        ("schema_version", pa.int32()),
        ("event_date", pa.date32()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("ingest_time", pa.timestamp("us", tz="UTC")),
    ]
)
REJECTED_SCHEMA = pa.schema(
    [
        ("value", pa.binary()),
        ("key", pa.binary()),
        ("reason", pa.string()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
# mapInArrow output: both kinds side by side; `reason` is null for valid events.
PARSED_SCHEMA = pa.schema(
    [f for f in EVENTS_SCHEMA if f.name not in ("kafka_partition", "kafka_offset")]
    + list(REJECTED_SCHEMA)
)
_MS_PER_DAY = 86_400_000


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over Spark kafka-source batches (value, key, topic, partition,
    offset, timestamp)."""
    for batch in batches:
        yield parse_batch(batch)


def parse_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    values = batch.column("value").to_pylist()
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds
    now_ms = time.time_ns() // 1_000_000
    n = len(values)
    cols: dict[str, list[object]] = {name: [None] * n for name in PARSED_SCHEMA.names}
    event_id, event_type, event_time = cols["event_id"], cols["event_type"], cols["event_time"]
    impression, ad, campaign = cols["impression_id"], cols["ad_id"], cols["campaign_id"]
    site, country, device = cols["site_id"], cols["country"], cols["device_type"]
    user, version, date = cols["user_id"], cols["schema_version"], cols["event_date"]
    reason, raw = cols["reason"], cols["value"]
    for i, value in enumerate(values):
        stamp_us = stamps[i]
        reference_ms = min(stamp_us // 1000, now_ms) if stamp_us is not None else now_ms
        if value is None:
            reason[i] = "record: no value (a null Kafka record)"
            continue
        result = validate(value, reference_ms)
        if type(result) is Invalid:
            reason[i] = result.reason
            raw[i] = value
            continue
        event_id[i] = result.event_id  # type: ignore[union-attr]
        event_type[i] = result.event_type  # type: ignore[union-attr]
        millis = result.event_time  # type: ignore[union-attr]
        event_time[i] = millis * 1000
        impression[i] = result.impression_id  # type: ignore[union-attr]
        ad[i] = result.ad_id  # type: ignore[union-attr]
        campaign[i] = result.campaign_id  # type: ignore[union-attr]
        site[i] = result.site_id  # type: ignore[union-attr]
        country[i] = result.country  # type: ignore[union-attr]
        device[i] = result.device_type  # type: ignore[union-attr]
        user[i] = result.user_id  # type: ignore[union-attr]
        version[i] = result.schema_version  # type: ignore[union-attr]
        date[i] = millis // _MS_PER_DAY
    rejected = pa.array([r is not None for r in reason])
    stamp_column = batch.column("timestamp")
    arrays = []
    for field in PARSED_SCHEMA:
        name = field.name
        if name == "ingest_time":
            arrays.append(stamp_column)
        elif name == "kafka_timestamp":
            arrays.append(pc.if_else(rejected, stamp_column, None))
        elif name == "key":
            arrays.append(pc.if_else(rejected, batch.column("key"), None))
        elif name == "kafka_topic":
            arrays.append(batch.column("topic"))
        elif name == "kafka_partition":
            arrays.append(batch.column("partition"))
        elif name == "kafka_offset":
            arrays.append(batch.column("offset"))
        elif name in ("event_time",):
            arrays.append(pa.array(cols[name], pa.int64()).cast(field.type))
        elif name == "event_date":
            arrays.append(pa.array(cols[name], pa.int32()).cast(pa.date32()))
        else:
            arrays.append(pa.array(cols[name], field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def split(parsed: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(events rows, rejected rows) of parsed records, in the tables' schemas."""
    valid = pc.is_null(parsed.column("reason"))
    events = parsed.filter(valid).select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
    rejected = parsed.filter(pc.invert(valid)).select(REJECTED_SCHEMA.names).cast(REJECTED_SCHEMA)
    return events, rejected
