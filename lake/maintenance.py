"""Keeping the lake small and fast, through delta-spark: compaction (OPTIMIZE) and VACUUM of
the batch tables (the streaming jobs maintain their own:
:meth:`lake.append_table.AppendTable.maintain`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lake.retention import STREAMING_TABLES
from lake.settings import LakeSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("ctr.maintenance")


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_added: int
    files_removed: int
    files_vacuumed: int


def compact_and_vacuum(
    spark: SparkSession, lake: LakeSettings, table: str, *, retention_hours: float | None = None
) -> MaintenanceReport | None:
    """Bin-pack small files (OPTIMIZE), then delete the files no version within
    ``retention_hours`` (whole hours; default the table's ``delta.deletedFileRetentionDuration``,
    ``LAKE_VACUUM_RETENTION_HOURS`` for the tables set here) needs (VACUUM). A table the
    streaming jobs do not write gets its history window first (:mod:`lake.retention`: its
    writers, Spark batch jobs, set none). None when the table does not exist yet."""
    from delta.tables import DeltaTable

    path = lake.table(table)
    if not DeltaTable.isDeltaTable(spark, path):
        log.info("%s: no table yet", table)
        return None
    # delta-spark's VACUUM rounds RETAIN to whole hours (0.25 h became 0: the soak's VACUUM
    # deleted the files a batch run was about to commit, which the API then could not find);
    # by default the table's own deletedFileRetentionDuration (set below, in minutes) rules.
    if retention_hours is not None and retention_hours != int(retention_hours):
        raise ValueError(
            f"retention_hours must be whole hours for delta-spark's VACUUM, got {retention_hours}"
        )
    retain = "" if retention_hours is None else f" RETAIN {int(retention_hours)} HOURS"
    delta = DeltaTable.forPath(spark, path)
    if table not in STREAMING_TABLES:  # those: their writer sets them (lake.append_table)
        _ensure_properties(spark, path, lake.retention(table))
    metrics = delta.optimize().executeCompaction().collect()[0]["metrics"]
    # The data files VACUUM will delete (its dry run also lists their checksum files).
    vacuum = f"VACUUM delta.`{path.replace('`', '``')}`{retain}"
    doomed = spark.sql(f"{vacuum} DRY RUN").where("path LIKE '%.parquet'").count()
    spark.sql(vacuum).collect()
    return MaintenanceReport(
        table, int(metrics["numFilesAdded"]), int(metrics["numFilesRemoved"]), int(doomed)
    )


def compact_and_vacuum_all(
    spark: SparkSession, lake: LakeSettings, tables: Sequence[str]
) -> list[MaintenanceReport]:
    """:func:`compact_and_vacuum` each of ``tables`` in turn, every one tried; raises at the
    end if any failed (naming them), after logging each report."""
    reports: list[MaintenanceReport] = []
    failed: dict[str, str] = {}
    for table in tables:
        try:
            report = compact_and_vacuum(spark, lake, table)
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


def _ensure_properties(spark: SparkSession, path: str, wanted: dict[str, str]) -> None:
    rows = spark.sql(f"SHOW TBLPROPERTIES delta.`{path.replace('`', '``')}`").collect()
    current = {str(row["key"]): str(row["value"]) for row in rows}
    missing = {k: v for k, v in wanted.items() if current.get(k) != v}
    if missing:
        assignments = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(missing.items()))
        spark.sql(
            f"ALTER TABLE delta.`{path.replace('`', '``')}` SET TBLPROPERTIES ({assignments})"
        )
