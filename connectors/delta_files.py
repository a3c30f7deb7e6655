"""Delta table files: Parquet with statistics written by tasks, committed by the driver.

The split mirrors delta-spark: every Spark task writes its own Parquet files and reports them
(path, size, partition values, per-column min/max/null counts) in its commit message; the
driver then commits all of them in one Delta transaction with delta-rs. Nothing is visible to
readers until that commit; an aborted job deletes its files.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_STATS_TYPES = (pa.types.is_integer, pa.types.is_floating, pa.types.is_string,
                pa.types.is_date, pa.types.is_timestamp, pa.types.is_boolean)  # fmt: skip


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written into a table directory, not yet committed."""

    path: str  # relative to the table root, "/"-separated
    size: int
    partition_values: dict[str, str | None]
    modification_time: int  # epoch ms
    stats: str  # Delta statistics JSON
    rows: int


def write_files(
    table_root: str,
    data: pa.Table,
    partition_by: Sequence[str],
    *,
    target_rows: int = 2_000_000,
) -> list[DataFile]:
    """Write ``data`` under ``table_root`` as Parquet, one directory per partition value."""
    if data.num_rows == 0:
        return []
    for column in partition_by:
        if column not in data.column_names:
            raise ValueError(f"partition column {column!r} is not in the data {data.column_names}")
    groups = _split_by_partition(data, partition_by) if partition_by else [({}, data)]
    files = []
    for values, rows in groups:
        directory = "/".join(f"{k}={_escape(v)}" for k, v in values.items())
        payload = rows.drop_columns(list(partition_by)) if partition_by else rows
        for start in range(0, payload.num_rows, target_rows):
            chunk = payload.slice(start, target_rows)
            name = f"part-{uuid.uuid4().hex}.snappy.parquet"
            relative = f"{directory}/{name}" if directory else name
            full = Path(table_root) / relative
            full.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(chunk, full, compression="snappy", write_statistics=True)
            files.append(
                DataFile(
                    path=relative,
                    size=full.stat().st_size,
                    partition_values=values,
                    modification_time=int(time.time() * 1000),
                    stats=statistics(chunk),
                    rows=chunk.num_rows,
                )
            )
    return files


def delete_files(table_root: str, files: Iterable[DataFile]) -> None:
    for file in files:
        (Path(table_root) / file.path).unlink(missing_ok=True)


def statistics(table: pa.Table) -> str:
    """Delta file statistics: numRecords and min/max/nullCount of the columns that have them.

    Bounds must contain every value (readers skip files by them), so timestamps, which Delta
    stores at millisecond precision, round the minimum down and the maximum up.
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        nulls[name] = column.null_count
        if not any(check(column.type) for check in _STATS_TYPES) or column.null_count == len(
            column
        ):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if isinstance(low, float) and (math.isnan(low) or math.isnan(high)):
            continue
        mins[name], maxs[name] = _stat_value(low, up=False), _stat_value(high, up=True)
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def _stat_value(value: Any, *, up: bool) -> Any:
    if isinstance(value, dt.datetime):
        value = value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
        floor = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if up and floor != value:
            floor += dt.timedelta(milliseconds=1)
        return floor.strftime("%Y-%m-%dT%H:%M:%S.") + f"{floor.microsecond // 1000:03d}Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _split_by_partition(
    data: pa.Table, partition_by: Sequence[str]
) -> list[tuple[dict[str, str | None], pa.Table]]:
    keys = data.select(list(partition_by)).group_by(list(partition_by)).aggregate([])
    groups = []
    for row in keys.to_pylist():
        mask = None
        for column, value in row.items():
            test = pc.is_null(data[column]) if value is None else pc.equal(data[column], value)
            mask = test if mask is None else pc.and_(mask, test)
        values = {c: _partition_value(row[c]) for c in partition_by}
        groups.append((values, data.filter(mask)))
    return groups


def _partition_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)


def _escape(value: str | None) -> str:
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    return "".join(c if c.isalnum() or c in "-_." else f"%{ord(c):02X}" for c in value)
