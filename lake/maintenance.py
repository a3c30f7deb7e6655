"""Keeping the lake small and fast, through delta-rs: compaction (OPTIMIZE; for the batch
views, hour by hour: :func:`lake.view_files.compact_hours`) and VACUUM of the batch tables (the
streaming jobs maintain their own: :meth:`lake.append_table.AppendTable.maintain`), and the
key store's superseded last uses dropped (:func:`lake.keys.fold_uses`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from lake.catalog import API_KEYS, BATCH_CTR, VERSIONED
from lake.keys import fold_uses
from lake.retention import STREAMING_TABLES
from lake.settings import LakeSettings
from lake.storage import ensure_properties, is_delta, open_delta
from lake.view_files import compact_hours

log = logging.getLogger("ctr.maintenance")

VIEW_TABLES = frozenset(t.name for t in (BATCH_CTR, *VERSIONED))


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_added: int
    files_removed: int
    files_vacuumed: int


def compact_and_vacuum(
    lake: LakeSettings, table: str, *, retention_hours: float | None = None
) -> MaintenanceReport | None:
    """Bin-pack small files (OPTIMIZE), then delete the files no version within
    ``retention_hours`` (whole hours; default the table's ``delta.deletedFileRetentionDuration``,
    ``LAKE_VACUUM_RETENTION_HOURS`` for the tables set here) needs (VACUUM). A table the
    streaming jobs do not write gets its history window first (:mod:`lake.retention`). None
    when the table does not exist yet. Through delta-rs, like every commit to the lake
    (:mod:`lake.frames`): a compaction racing a batch run's commit is a conflict, not a loss."""
    path = lake.table(table)
    if not is_delta(path):
        log.info("%s: no table yet", table)
        return None
    if retention_hours is not None and retention_hours != int(retention_hours):
        raise ValueError(f"retention_hours must be whole hours, got {retention_hours}")
    if table == API_KEYS.name:
        folded = fold_uses(lake)
        if folded:
            log.info("%s: %d superseded last-use events dropped", table, folded)
    delta = open_delta(path)
    if table not in STREAMING_TABLES:  # those: their writer sets them (lake.append_table)
        ensure_properties(delta, lake.retention(table))
    if table in VIEW_TABLES:  # keeps the hour files batch runs replace (lake.view_files)
        compacted = compact_hours(path)
        if compacted.hours_left:
            log.info("%s: %d hour(s) left to compact next pass", table, compacted.hours_left)
        delta = open_delta(path)
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
        full=True,
    )
    return MaintenanceReport(
        table,
        int(metrics.get("numFilesAdded", 0)),
        int(metrics.get("numFilesRemoved", 0)),
        sum(1 for f in vacuumed if f.endswith(".parquet")),
    )


def compact_and_vacuum_all(lake: LakeSettings, tables: Sequence[str]) -> list[MaintenanceReport]:
    """:func:`compact_and_vacuum` each of ``tables`` in turn, every one tried; raises at the
    end if any failed (naming them), after logging each report."""
    reports: list[MaintenanceReport] = []
    failed: dict[str, str] = {}
    for table in tables:
        try:
            report = compact_and_vacuum(lake, table)
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
