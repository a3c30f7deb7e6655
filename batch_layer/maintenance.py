"""Keeping the lake small and fast: compaction, vacuum, and pruning of superseded speed rows."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from infra.lake import LakeSettings

log = logging.getLogger("ctr.maintenance")

TABLES = ("master/events", "master/rejected", "batch/ctr", "batch/coverage", "speed/ctr")


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_added: int
    files_removed: int
    files_vacuumed: int


def compact_and_vacuum(
    lake: LakeSettings, table: str, *, retention_hours: int = 168
) -> MaintenanceReport | None:
    """Bin-pack small files, then delete files no version within ``retention_hours`` needs."""
    from deltalake import DeltaTable

    path = lake.table(table)
    if not DeltaTable.is_deltatable(path):
        log.info("%s: no table yet", table)
        return None
    delta = DeltaTable(path)
    metrics = delta.optimize.compact()
    vacuumed = delta.vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
    )
    return MaintenanceReport(
        table,
        int(metrics.get("numFilesAdded", 0)),
        int(metrics.get("numFilesRemoved", 0)),
        len(vacuumed),
    )


def covered_intervals(
    lake: LakeSettings, view: str = "ctr"
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The [start, end) intervals finished batch runs of ``view`` hold, merged."""
    from deltalake import DeltaTable

    path = lake.table("batch/coverage")
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_table(columns=["view", "interval_start", "interval_end"])
    spans = sorted(
        (r["interval_start"], r["interval_end"]) for r in rows.to_pylist() if r["view"] == view
    )
    merged: list[tuple[dt.datetime, dt.datetime]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def prune_speed(lake: LakeSettings) -> int:
    """Delete speed/ctr rows in buckets the batch layer covers; returns rows deleted."""
    from deltalake import DeltaTable

    path = lake.table("speed/ctr")
    intervals = covered_intervals(lake)
    if not intervals or not DeltaTable.is_deltatable(path):
        return 0
    predicate = " OR ".join(
        f"(bucket_start >= '{_iso(start)}' AND bucket_start < '{_iso(end)}')"
        for start, end in intervals
    )
    metrics = DeltaTable(path).delete(predicate)
    return int(metrics.get("num_deleted_rows", 0))


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
