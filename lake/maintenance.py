"""Keeping the lake small and fast, through delta-spark: compaction (OPTIMIZE), VACUUM, and the
pruning of speed rows the batch layer has superseded."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lake.settings import LakeSettings
from runtime.formats import read_delta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("ctr.maintenance")

TABLES = ("master/events", "master/rejected", "batch/ctr", "batch/coverage", "speed/ctr")


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_added: int
    files_removed: int
    files_vacuumed: int


def compact_and_vacuum(
    spark: SparkSession, lake: LakeSettings, table: str, *, retention_hours: float = 168
) -> MaintenanceReport | None:
    """Bin-pack small files (OPTIMIZE), then delete the files no version within
    ``retention_hours`` needs (VACUUM). None when the table does not exist yet."""
    from delta.tables import DeltaTable

    path = lake.table(table)
    if not DeltaTable.isDeltaTable(spark, path):
        log.info("%s: no table yet", table)
        return None
    delta = DeltaTable.forPath(spark, path)
    metrics = delta.optimize().executeCompaction().collect()[0]["metrics"]
    # The data files VACUUM will delete (its dry run also lists their checksum files).
    doomed = (
        spark.sql(
            f"VACUUM delta.`{path.replace('`', '``')}` RETAIN {float(retention_hours)} HOURS "
            "DRY RUN"
        )
        .where("path LIKE '%.parquet'")
        .count()
    )
    delta.vacuum(float(retention_hours))
    return MaintenanceReport(
        table, int(metrics["numFilesAdded"]), int(metrics["numFilesRemoved"]), int(doomed)
    )


def covered_intervals(
    spark: SparkSession, lake: LakeSettings, view: str = "ctr"
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The [start, end) intervals finished batch runs of ``view`` hold, merged."""
    from delta.tables import DeltaTable

    path = lake.table("batch/coverage")
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    from pyspark.sql import functions as F

    rows = (
        read_delta(spark, path)
        .where(F.col("view") == view)
        # Epoch microseconds: collect() would turn timestamps into the machine's local time.
        .select(F.unix_micros("interval_start"), F.unix_micros("interval_end"))
        .collect()
    )
    spans = sorted((_from_micros(start), _from_micros(end)) for start, end in rows)
    merged: list[tuple[dt.datetime, dt.datetime]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def prune_speed(spark: SparkSession, lake: LakeSettings) -> int:
    """Delete speed/ctr rows in buckets the batch layer covers; returns rows deleted."""
    from delta.tables import DeltaTable

    path = lake.table("speed/ctr")
    intervals = covered_intervals(spark, lake)
    if not intervals or not DeltaTable.isDeltaTable(spark, path):
        return 0
    predicate = " OR ".join(
        f"(bucket_start >= timestamp'{_iso(start)}' AND bucket_start < timestamp'{_iso(end)}')"
        for start, end in intervals
    )
    table = DeltaTable.forPath(spark, path)
    before = table.history(1).collect()[0]["version"]
    table.delete(predicate)
    [last] = table.history(1).collect()
    if last["version"] == before:
        return 0
    return int((last["operationMetrics"] or {}).get("numDeletedRows", 0))


def _from_micros(micros: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S+00:00")
