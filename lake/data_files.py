"""Parquet data files of a Delta table, written where the rows are (a Spark task) and committed
later by the table's one writer (:meth:`lake.append_table.AppendTable.commit`).

A task writes its rows of one micro-batch straight under the table's directory, one file per
partition value, and returns only each file's description: the Delta ``add`` action with the
statistics readers skip files by (``numRecords``, and per column ``minValues``, ``maxValues``,
``nullCount``). The rows never travel back through the JVM to the driver. Until the driver
commits them the files are invisible to every reader; a task retried by Spark, or a batch
whose commit never came (a crash), leaves files no commit names, which VACUUM removes once
they are older than the table's retention.

Statistics follow what Delta readers expect: timestamps as ISO-8601 UTC strings at millisecond
precision (the minimum rounded down, the maximum up, so the range still holds every row), and
strings of up to :data:`STRING_STATS_CHARS` characters (a longer minimum is cut to a prefix,
still a lower bound; a longer maximum is left out, as delta-spark does for a bound it cannot
state). Binary columns get null counts only.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Sequence
from typing import Final, TypedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lake.storage import arrow_filesystem

STRING_STATS_CHARS: Final = 32
# A task's answer to the driver: one row per data file written.
FILES_SCHEMA: Final = pa.schema(
    [
        ("table", pa.string()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),  # JSON object, Delta's string form of each value
        ("modification_time", pa.int64()),
        ("stats", pa.string()),
    ]
)


class DataFile(TypedDict):
    """A file written and not yet committed: a row of :data:`FILES_SCHEMA`."""

    table: str
    path: str  # relative to the table's root
    size: int
    partition_values: str
    modification_time: int
    stats: str


def write_files(
    table: str,
    root: str,  # the table's root: a local path or a URI
    rows: pa.Table,
    partition_by: Sequence[str] = (),
    *,
    dictionary: Sequence[str] | None = None,
) -> list[DataFile]:
    """Write ``rows`` (in the table's schema) as new Parquet files under ``root``: one per
    combination of ``partition_by`` values (Hive-style directories, the partition columns left
    out of the file). ``dictionary``: the columns worth dictionary-encoding (few distinct
    values; None: every column, Parquet's default). Returns the files' descriptions, named
    ``table`` for the caller."""
    if rows.num_rows == 0:
        return []
    if not partition_by:
        return [_write(table, root, rows, {}, dictionary)]
    keys = rows.select(list(partition_by)).group_by(list(partition_by)).aggregate([])
    files = []
    for key in keys.to_pylist():
        part = rows
        if keys.num_rows > 1:
            mask = None
            for name, value in key.items():
                column = rows.column(name)
                match = pc.is_null(column) if value is None else pc.equal(column, value)
                mask = match if mask is None else pc.and_(mask, match)
            part = rows.filter(mask)
        values = {name: _partition_string(value) for name, value in key.items()}
        part = part.drop_columns(list(partition_by))
        files.append(_write(table, root, part, values, dictionary))
    return files


def _write(
    table: str,
    root: str,
    rows: pa.Table,
    values: dict[str, str | None],
    dictionary: Sequence[str] | None,
) -> DataFile:
    directory = "/".join(f"{name}={_escape(value)}" for name, value in values.items())
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    relative = f"{directory}/{name}" if directory else name
    # A local path or the lake's object store (lake.storage).
    filesystem, base = arrow_filesystem(root)
    target = f"{base.rstrip('/')}/{relative}"
    filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
    encode: bool | list[str] = True if dictionary is None else list(dictionary)
    pq.write_table(rows, target, filesystem=filesystem, compression="snappy", use_dictionary=encode)
    return DataFile(
        table=table,
        path=relative,
        size=filesystem.get_file_info(target).size,
        partition_values=json.dumps(values),
        modification_time=time.time_ns() // 1_000_000,
        stats=json.dumps(file_stats(rows)),
    )


def file_stats(rows: pa.Table) -> dict[str, object]:
    """Delta's per-file statistics of ``rows``."""
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for field, column in zip(rows.schema, rows.columns, strict=True):
        nulls[field.name] = column.null_count
        if column.null_count == len(column) or not _has_bounds(field.type):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if pa.types.is_timestamp(field.type):
            minimum[field.name] = _timestamp(low, up=False)
            maximum[field.name] = _timestamp(high, up=True)
        elif pa.types.is_string(field.type):
            minimum[field.name] = low[:STRING_STATS_CHARS]
            if len(high) <= STRING_STATS_CHARS:
                maximum[field.name] = high
        elif pa.types.is_date(field.type):
            minimum[field.name], maximum[field.name] = low.isoformat(), high.isoformat()
        else:
            minimum[field.name], maximum[field.name] = low, high
    return {
        "numRecords": rows.num_rows,
        "minValues": minimum,
        "maxValues": maximum,
        "nullCount": nulls,
    }


def _has_bounds(kind: pa.DataType) -> bool:
    checks = (
        pa.types.is_integer,
        pa.types.is_floating,
        pa.types.is_timestamp,
        pa.types.is_date,
        pa.types.is_string,
    )
    return any(bool(check(kind)) for check in checks)


def _timestamp(value: dt.datetime, *, up: bool) -> str:
    """``value`` (UTC) at millisecond precision, rounded down or ``up``."""
    value = value.astimezone(dt.UTC)
    extra = value.microsecond % 1000
    value -= dt.timedelta(microseconds=extra)
    if up and extra:
        value += dt.timedelta(milliseconds=1)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def _partition_string(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return str(value)


def _escape(value: str | None) -> str:
    """A partition value as a directory name: the values partitioned on here (dates, numbers)
    need no escaping; anything else is refused rather than written under a wrong name."""
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    if not _SAFE.fullmatch(value):
        raise ValueError(f"partition value {value!r} would need escaping in a path")
    return value


_SAFE: Final = re.compile(r"[A-Za-z0-9._+-]+")
