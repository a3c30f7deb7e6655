"""Kafka records -> master dataset rows: parsed with the ingest validator, valid or rejected.

The same :func:`events.model.validate` as every producer, with the record's Kafka timestamp as
the reference time, so a record replayed after a crash gets the same verdict. The reference is
never later than the clock at parse time: a producer that stamps its records in the year 3000
(or sets no timestamp) does not get year-3000 events past the far-future check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.compute as pc

from events.model import Invalid, validate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
# The kafka-source columns a parse reads (Spark's ``timestampType`` and ``headers`` are not).
KAFKA_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp")


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over Spark kafka-source batches (value, key, topic, partition,
    offset, timestamp)."""
    for batch in batches:
        yield parse_batch(batch)


def parse_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    cols = _parse_values(
        batch.column("value").to_pylist(),
        batch.column("timestamp").cast(pa.int64()).to_pylist(),  # microseconds
        now_ms=time.time_ns() // 1_000_000,
    )
    rejected = pa.array([r is not None for r in cols["reason"]])
    arrays = [_output_column(field, batch, cols, rejected) for field in PARSED_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def _parse_values(
    values: list[bytes | None], stamps: list[int | None], *, now_ms: int
) -> dict[str, list[object]]:
    """Validate every Kafka value: the parsed columns of :data:`PARSED_SCHEMA`, by name (the
    event's fields, ``event_date``, ``reason`` and ``value``; the rest stay null)."""
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
        if isinstance(result, Invalid):
            reason[i] = result.reason
            raw[i] = value
            continue
        event_id[i] = result.event_id
        event_type[i] = result.event_type
        millis = result.event_time
        event_time[i] = millis * 1000
        impression[i] = result.impression_id
        ad[i] = result.ad_id
        campaign[i] = result.campaign_id
        site[i] = result.site_id
        country[i] = result.country
        device[i] = result.device_type
        user[i] = result.user_id
        version[i] = result.schema_version
        date[i] = millis // _MS_PER_DAY
    return cols


# Output columns copied from the Kafka batch, and those kept only for rejected records.
_FROM_KAFKA: Final = {
    "ingest_time": "timestamp",
    "kafka_topic": "topic",
    "kafka_partition": "partition",
    "kafka_offset": "offset",
}
_FROM_KAFKA_IF_REJECTED: Final = {"kafka_timestamp": "timestamp", "key": "key"}


def _output_column(
    field: pa.Field, batch: pa.RecordBatch, cols: dict[str, list[object]], rejected: pa.Array
) -> pa.Array:
    name = field.name
    if name in _FROM_KAFKA:
        return batch.column(_FROM_KAFKA[name])
    if name in _FROM_KAFKA_IF_REJECTED:
        return pc.if_else(rejected, batch.column(_FROM_KAFKA_IF_REJECTED[name]), None)
    if name == "event_time":
        return pa.array(cols[name], pa.int64()).cast(field.type)
    if name == "event_date":
        return pa.array(cols[name], pa.int32()).cast(pa.date32())
    return pa.array(cols[name], field.type)


def split(parsed: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(events rows, rejected rows) of parsed records, in the tables' schemas."""
    valid = pc.is_null(parsed.column("reason"))
    events = parsed.filter(valid).select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
    rejected = parsed.filter(pc.invert(valid)).select(REJECTED_SCHEMA.names).cast(REJECTED_SCHEMA)
    return events, rejected


def parse_records(raw: DataFrame) -> DataFrame:
    """The records of a Spark ``kafka`` source (batch or stream), parsed: the columns of
    :data:`PARSED_SCHEMA`, ``reason`` null for valid events (the speed job)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return one_task_per_core(raw).mapInArrow(parse_batches, from_arrow_schema(PARSED_SCHEMA))


def one_task_per_core(raw: DataFrame) -> DataFrame:
    """The :data:`KAFKA_COLUMNS` of a Spark ``kafka`` source, its partitions coalesced to one
    task per core (no shuffle), for a Python function to parse them.

    Every task that runs Python costs a fixed ~100 ms of handing data to and from a Python
    worker, whatever its size (measured on a 2-core machine: 6 tasks of 1,000 records took
    450 ms, 2 tasks 190 ms), and a micro-batch of the speed layer or the archiver is that
    small."""
    cores = raw.sparkSession.sparkContext.defaultParallelism
    return raw.select(*KAFKA_COLUMNS).coalesce(cores)
