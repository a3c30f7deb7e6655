"""Kafka records -> master dataset rows: parsed with the ingest validator, valid or rejected.

The same :func:`events.model.validate` as every producer, with the record's Kafka timestamp as
the reference time, so a record replayed after a crash gets the same verdict. The reference is
never later than the clock at parse time: a producer that stamps its records in the year 3000
(or sets no timestamp) does not get year-3000 events past the far-future check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from events.model import Event, validate_many

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
# The speed job's parse: every record, a master/events row (the event's columns null for a refused
# record) and the reason it was refused (null for a valid event).
PARSED_SCHEMA = pa.schema([*EVENTS_SCHEMA, ("reason", pa.string())])
# The kafka-source columns a parse reads (Spark's ``timestampType`` and ``headers`` are not).
KAFKA_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp")
# What a master/events row takes from its Kafka record, and the reason a null record gets.
_EVENT_KAFKA_COLUMNS: Final = ("timestamp", "partition", "offset")
_NO_VALUE: Final = "record: no value (a null Kafka record)"
# The event's string fields, as master/events names them.
_STRING_FIELDS: Final = tuple(
    f.name for f in EVENTS_SCHEMA if f.type == pa.string() and f.name in Event.__struct_fields__
)
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_MS_PER_DAY: Final = 86_400_000


@dataclass(frozen=True)
class Parsed:
    """The records of a Kafka-source batch as rows of master/events and master/rejected."""

    events: pa.Table  # EVENTS_SCHEMA
    rejected: pa.Table  # REJECTED_SCHEMA


def parse(batch: pa.RecordBatch, *, now_ms: int | None = None) -> Parsed:
    """Validate every record of a Spark kafka-source batch (the :data:`KAFKA_COLUMNS`): the
    valid events as master/events rows, the rest as master/rejected rows with the reason and the
    raw bytes. ``now_ms`` caps each record's reference time (default: the clock)."""
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    values = batch.column("value")
    records = values.to_pylist()
    verdicts = validate_many(records, _references_ms(batch.column("timestamp"), now_ms))
    valid, invalid, reasons = verdicts.valid_rows, verdicts.invalid_rows, verdicts.reasons
    if values.null_count:  # the validator refuses None as JSON; say what it is in Kafka terms
        reasons = [
            _NO_VALUE if records[row] is None else reason
            for row, reason in zip(invalid, reasons, strict=True)
        ]
    return Parsed(
        _events_table(verdicts.events, _rows(batch, valid, _EVENT_KAFKA_COLUMNS)),
        _rejected_table(_rows(batch, invalid, KAFKA_COLUMNS), reasons),
    )


def _rows(batch: pa.RecordBatch, rows: list[int], columns: tuple[str, ...]) -> pa.RecordBatch:
    """``columns`` of ``batch`` at ``rows`` (ascending)."""
    chosen = batch.select(list(columns))
    if len(rows) == batch.num_rows:
        return chosen
    return chosen.take(pa.array(rows, pa.int64()))


def _references_ms(stamps: pa.Array, now_ms: int) -> list[int]:
    """Each record's reference time for the far-future check: its Kafka timestamp (ms, floored),
    never later than ``now_ms``; ``now_ms`` when it has none."""
    micros = stamps.cast(pa.int64()).fill_null(now_ms * 1000).to_numpy(zero_copy_only=False)
    references: list[int] = np.minimum(np.floor_divide(micros, 1000), now_ms).tolist()
    return references


def _events_table(events: list[Event], kafka: pa.RecordBatch) -> pa.Table:
    """master/events rows: ``events`` with the Kafka coordinates of their records (``kafka``,
    row for row)."""
    columns: dict[str, pa.Array] = {
        name: pa.array(list(map(attrgetter(name), events)), pa.string()) for name in _STRING_FIELDS
    }
    millis = pa.array(list(map(attrgetter("event_time"), events)), pa.int64())
    columns["event_time"] = pc.multiply(millis, 1000).cast(_TIMESTAMP)
    columns["event_date"] = pc.divide(millis, _MS_PER_DAY).cast(pa.int32()).cast(pa.date32())
    columns["schema_version"] = pa.array(
        list(map(attrgetter("schema_version"), events)), pa.int32()
    )
    columns["kafka_partition"] = kafka.column("partition").cast(pa.int32())
    columns["kafka_offset"] = kafka.column("offset").cast(pa.int64())
    columns["ingest_time"] = kafka.column("timestamp").cast(_TIMESTAMP)
    return pa.table([columns[f.name] for f in EVENTS_SCHEMA], schema=EVENTS_SCHEMA)


def _rejected_table(kafka: pa.RecordBatch, reasons: list[str]) -> pa.Table:
    """master/rejected rows: the refused records (``kafka``) with their ``reasons``."""
    columns = {
        "value": kafka.column("value"),
        "key": kafka.column("key"),
        "reason": pa.array(reasons, pa.string()),
        "kafka_topic": kafka.column("topic"),
        "kafka_partition": kafka.column("partition"),
        "kafka_offset": kafka.column("offset"),
        "kafka_timestamp": kafka.column("timestamp"),
    }
    return pa.table(columns).cast(REJECTED_SCHEMA)


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over Spark kafka-source batches: :data:`PARSED_SCHEMA` rows, the
    valid events first, then the refused records (the speed job)."""
    for batch in batches:
        yield from parse_batch(batch).to_batches()


def parse_batch(batch: pa.RecordBatch) -> pa.Table:
    """:func:`parse` as one table of :data:`PARSED_SCHEMA`: the valid events (``reason``
    null), then the refused records (the event's columns null, the Kafka coordinates kept)."""
    parsed = parse(batch)
    rejected = parsed.rejected.rename_columns(
        ["ingest_time" if n == "kafka_timestamp" else n for n in parsed.rejected.column_names]
    )
    return pa.concat_tables([_as_parsed(parsed.events), _as_parsed(rejected)])


def _as_parsed(table: pa.Table) -> pa.Table:
    """``table`` in :data:`PARSED_SCHEMA`, the columns it lacks null."""
    n = table.num_rows
    columns = [
        table.column(f.name) if f.name in table.schema.names else pa.nulls(n, f.type)
        for f in PARSED_SCHEMA
    ]
    return pa.table(columns, schema=PARSED_SCHEMA)


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
