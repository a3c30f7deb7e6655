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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings

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


def files_of(rows: Iterable[Mapping[str, Any]], table: str) -> list[DataFile]:
    """The files of ``table`` among the rows of :data:`FILES_SCHEMA` tasks returned (rows of
    other tables, or of other kinds, are left out)."""
    return [DataFile(**r) for r in rows if r["table"] == table]  # type: ignore[typeddict-item]


def write_files(
    table: str,
    root: str,  # the table's root: a local path or a URI
    store: ObjectStoreSettings,  # the lake's object store (a task has it in its closure)
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
        return [_write(table, root, store, rows, {}, dictionary=dictionary)]
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
        values = {name: partition_string(value) for name, value in key.items()}
        part = part.drop_columns(list(partition_by))
        files.append(_write(table, root, store, part, values, dictionary=dictionary))
    return files


def _write(
    table: str,
    root: str,
    store: ObjectStoreSettings,
    rows: pa.Table,
    values: dict[str, str | None],
    *,
    dictionary: Sequence[str] | None,
) -> DataFile:
    directory = "/".join(f"{name}={_escape(value)}" for name, value in values.items())
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    relative = f"{directory}/{name}" if directory else name
    # A local path or the lake's object store (lake.storage).
    filesystem, base = arrow_filesystem(root, store)
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


def partition_string(value: object) -> str | None:
    """A partition value in Delta's string form (a date or time in ISO 8601)."""
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


# Rows of a row group of :class:`HourFiles` (buffered per open file until then).
ROW_GROUP_ROWS: Final = 128 * 1024
# Rows in one data file of :class:`HourFiles` at most: a file is never larger than this, so no
# reader or compaction has to hold more of it (about 60 MB of view rows with reach).
ROWS_PER_FILE: Final = 1_000_000


class HourFiles:
    """The data files one Spark task writes for a batch view: rows arrive in batches, in any
    order, and go to one open file per hour of ``column`` (a timestamp), so no file straddles an
    hour (an interval a batch run replaces then removes whole files: :mod:`lake.view_files`).
    A file is closed after the batch that brings it to :data:`ROWS_PER_FILE` rows. Rows are
    buffered per open file up to :data:`ROW_GROUP_ROWS` (one row group): with rows sorted by
    ``column`` (:func:`lake.view_files.write` sorts them), one file is open at a time and a
    task holds at most that many rows, however many it writes."""

    def __init__(
        self,
        table: str,
        root: str,
        store: ObjectStoreSettings,
        schema: pa.Schema,
        column: str,
    ) -> None:
        self.table, self.root, self.schema, self.column = table, root, schema, column
        self.store = store
        self._open: dict[dt.datetime, _OpenFile] = {}
        self.files: list[DataFile] = []
        self.counted: dict[str, int] = {}  # per file (its path): rows written with counted=True

    def write(self, rows: pa.Table, *, counted: bool = False) -> None:
        """Write ``rows`` (in :attr:`schema`) to the files of their hours; ``counted``: add them
        to their files' :attr:`counted` (e.g. the rows of the interval a run replaces)."""
        if rows.num_rows == 0:
            return
        hours = pc.floor_temporal(rows.column(self.column), unit="hour")
        distinct = pc.unique(hours)
        for hour in distinct:
            part = rows if len(distinct) == 1 else rows.filter(pc.equal(hours, hour))
            key = hour.as_py()
            self._file(key).write(part, counted=counted)
            if self._open[key].rows >= ROWS_PER_FILE:
                self._closed(self._open.pop(key))

    def _file(self, hour: dt.datetime) -> _OpenFile:
        if hour not in self._open:
            self._open[hour] = _OpenFile(self.table, self.root, self.store, self.schema)
        return self._open[hour]

    def close(self) -> list[DataFile]:
        """Close every open file; all the files written, described for the commit."""
        for open_file in self._open.values():
            self._closed(open_file)
        self._open.clear()
        return self.files

    def _closed(self, open_file: _OpenFile) -> None:
        self.files.append(open_file.close())
        self.counted[open_file.relative] = open_file.counted


class _OpenFile:
    """A Parquet file being written (see :class:`HourFiles`), with its statistics so far."""

    def __init__(
        self, table: str, root: str, store: ObjectStoreSettings, schema: pa.Schema
    ) -> None:
        self.table = table
        self.relative = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        self.filesystem, base = arrow_filesystem(root, store)
        self.target = f"{base.rstrip('/')}/{self.relative}"
        self.writer = pq.ParquetWriter(
            self.target, schema, filesystem=self.filesystem, compression="snappy"
        )
        self.stats: dict[str, object] | None = None
        self.buffered: list[pa.Table] = []
        self.pending = 0  # rows buffered
        self.rows = 0
        self.counted = 0

    def write(self, rows: pa.Table, *, counted: bool) -> None:
        self.buffered.append(rows)
        self.pending += rows.num_rows
        self.rows += rows.num_rows
        self.counted += rows.num_rows if counted else 0
        if self.pending >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write the rows buffered as one row group (a task's batches are 10,000 rows, less
        once split by hour: written one by one, row groups that small cost time to write and
        read, and size: 17 % more bytes for a day's view)."""
        if not self.buffered:
            return
        rows = pa.concat_tables(self.buffered)
        self.buffered, self.pending = [], 0
        self.writer.write_table(rows, row_group_size=rows.num_rows)
        stats = file_stats(rows)
        self.stats = stats if self.stats is None else merge_stats(self.stats, stats)

    def close(self) -> DataFile:
        self.flush()
        self.writer.close()
        return DataFile(
            table=self.table,
            path=self.relative,
            size=self.filesystem.get_file_info(self.target).size,
            partition_values=json.dumps({}),
            modification_time=time.time_ns() // 1_000_000,
            stats=json.dumps(self.stats),
        )


def merge_stats(first: dict[str, object], second: dict[str, object]) -> dict[str, object]:
    """The statistics of two sets of rows (:func:`file_stats`) as one file's: a bound one side
    could not state (a long string's maximum, an all-null column) is left out, unless the other
    side's column is all null there."""
    low1, low2 = _bounds(first, "minValues"), _bounds(second, "minValues")
    high1, high2 = _bounds(first, "maxValues"), _bounds(second, "maxValues")
    nulls1, nulls2 = _counts(first), _counts(second)
    rows1, rows2 = _rows(first), _rows(second)
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    for name in nulls1.keys() | nulls2.keys():
        all_null1 = nulls1.get(name, 0) == rows1
        all_null2 = nulls2.get(name, 0) == rows2
        for merged, one, two, pick in (
            (minimum, low1, low2, min),
            (maximum, high1, high2, max),
        ):
            if name in one and name in two:
                merged[name] = pick(one[name], two[name])  # type: ignore[call-overload]
            elif name in one and all_null2:
                merged[name] = one[name]
            elif name in two and all_null1:
                merged[name] = two[name]
    return {
        "numRecords": rows1 + rows2,
        "minValues": minimum,
        "maxValues": maximum,
        "nullCount": {
            n: nulls1.get(n, 0) + nulls2.get(n, 0) for n in nulls1.keys() | nulls2.keys()
        },
    }


def _bounds(stats: dict[str, object], key: str) -> dict[str, object]:
    value = stats[key]
    assert isinstance(value, dict)
    return value


def _counts(stats: dict[str, object]) -> dict[str, int]:
    value = stats["nullCount"]
    assert isinstance(value, dict)
    return value


def _rows(stats: dict[str, object]) -> int:
    value = stats["numRecords"]
    assert isinstance(value, int)
    return value
