"""Keeping the lake small and fast, through delta-rs: compaction (OPTIMIZE; for the batch
views, hour by hour: :func:`lake.view_files.compact_hours`) and VACUUM of the batch tables (the
streaming jobs maintain their own: :meth:`lake.append_table.AppendTable.maintain`), and the
key store's superseded last uses dropped (:func:`fold_key_uses`).

Each pass is bounded by what changed since the last: the view tables' compaction takes at most
48 hours a pass, and VACUUM is *lite* (the files the log's tombstones name, however large the
table). A *full* VACUUM lists every file of the table, the only way to find files a failed run
wrote and never committed; ``ctr_maintenance`` runs one at the day's first pass
(:func:`full_vacuum_due`)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from lake.catalog import API_KEYS, BATCH_CTR, HOURS, REACH_CUBES, VERSIONED
from lake.retention import STREAMING_TABLES
from lake.settings import LakeSettings
from lake.storage import ensure_properties, is_delta, open_delta
from lake.view_files import compact_hours

log = logging.getLogger("ctr.maintenance")

VIEW_TABLES = frozenset(t.name for t in (BATCH_CTR, *VERSIONED, *HOURS, *REACH_CUBES))


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_added: int
    files_removed: int
    files_vacuumed: int
    full_vacuum: bool = True


def full_vacuum_due(start: dt.datetime | None, end: dt.datetime | None) -> bool:
    """Whether the maintenance pass of the schedule interval [start, end) vacuums in full: the
    first pass of a UTC day (its interval starts at midnight), every pass of a schedule a day
    or longer, and a pass run outside any schedule (no interval: by hand)."""
    if start is None or end is None:
        return True
    if end - start >= dt.timedelta(days=1):
        return True
    start = start.astimezone(dt.UTC)
    return (start.hour, start.minute, start.second) == (0, 0, 0)


def compact_and_vacuum(
    lake: LakeSettings,
    table: str,
    *,
    retention_hours: float | None = None,
    full_vacuum: bool = True,
) -> MaintenanceReport | None:
    """Bin-pack small files (OPTIMIZE), then delete the files no version within
    ``retention_hours`` (whole hours; default the table's ``delta.deletedFileRetentionDuration``,
    ``LAKE_VACUUM_RETENTION_HOURS`` for the tables set here) needs (VACUUM; ``full_vacuum``:
    listing every file, see the module's docstring, else lite). A table the
    streaming jobs do not write gets its history window first (:mod:`lake.retention`). None
    when the table does not exist yet. Through delta-rs, like every commit to the lake
    (:mod:`lake.frames`): a compaction racing a batch run's commit is a conflict, not a loss."""
    path = lake.table(table)
    if not is_delta(path, lake.object_store):
        log.info("%s: no table yet", table)
        return None
    if retention_hours is not None and retention_hours != int(retention_hours):
        raise ValueError(f"retention_hours must be whole hours, got {retention_hours}")
    if table == API_KEYS.name:
        folded = fold_key_uses(lake)
        if folded:
            log.info("%s: %d superseded last-use events dropped", table, folded)
    delta = open_delta(path, lake.object_store)
    if table not in STREAMING_TABLES:  # those: their writer sets them (lake.append_table)
        ensure_properties(delta, lake.retention(table))
    if table in VIEW_TABLES:  # keeps the hour files batch runs replace (lake.view_files)
        compacted = compact_hours(path, lake.object_store, table=delta)
        if compacted.hours_left:
            log.info("%s: %d hour(s) left to compact next pass", table, compacted.hours_left)
        if compacted.files_removed:
            delta = open_delta(path, lake.object_store)
        metrics = {
            "numFilesAdded": compacted.files_added,
            "numFilesRemoved": compacted.files_removed,
        }
    else:
        metrics = delta.optimize.compact()
    vacuumed = delta.vacuum(
        retention_hours=None if retention_hours is None else int(retention_hours),
        enforce_retention_duration=False,
        dry_run=False,
        full=full_vacuum,
    )
    return MaintenanceReport(
        table,
        int(metrics.get("numFilesAdded", 0)),
        int(metrics.get("numFilesRemoved", 0)),
        sum(1 for f in vacuumed if f.endswith(".parquet")),
        full_vacuum,
    )


def fold_key_uses(lake: LakeSettings) -> int:
    """Drop the ``used`` events of ``access/keys`` a later one of the same key supersedes (each
    API process records one a minute per key in use, :mod:`access.key_usage`, which would grow
    the table, and each reload, without bound), in one commit that writes the table again;
    returns how many were dropped (0: no commit). Run before the table is compacted. A create or
    revoke committed meanwhile is kept (tests/unit/test_keys.py)."""
    from deltalake import write_deltalake

    path = API_KEYS.path(lake)
    if not is_delta(path, lake.object_store):
        return 0
    table = open_delta(path, lake.object_store)
    rows = table.to_pyarrow_table().to_pylist()
    unique, used = [], set()
    for row in sorted(rows, key=lambda r: r["at"].astimezone(dt.UTC), reverse=True):
        if row["event"] == "used":
            if row["name"] in used:
                continue  # superseded by the newer use kept before it
            used.add(row["name"])
        unique.append(row)
    dropped = len(rows) - len(unique)
    if dropped:
        data = pa.Table.from_pylist(unique, schema=API_KEYS.schema)
        # Through the table as read: the overwrite removes the files of that version only, so
        # a revoke committed since (a file of its own) stays.
        write_deltalake(table, data, mode="overwrite")
    return dropped


def compact_and_vacuum_all(
    lake: LakeSettings, tables: Sequence[str], *, full_vacuum: bool = True
) -> list[MaintenanceReport]:
    """:func:`compact_and_vacuum` each of ``tables`` in turn, every one tried; raises at the
    end if any failed (naming them), after logging each report."""
    reports: list[MaintenanceReport] = []
    failed: dict[str, str] = {}
    for table in tables:
        try:
            report = compact_and_vacuum(lake, table, full_vacuum=full_vacuum)
        except Exception as exc:
            log.exception("%s: maintenance failed", table)
            failed[table] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            continue
        if report is not None:
            log.info("%s", report)
            reports.append(report)
    if failed:
        raise RuntimeError(
            "maintenance failed for " + "; ".join(f"{t}: {why}" for t, why in failed.items())
        )
    return reports
