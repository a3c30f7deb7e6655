"""How much history each Delta table keeps: log entries (time travel, as-of queries) and the
data files old versions need (until VACUUM). One place, so the writers that create a table and
the maintenance that keeps it agree (:class:`lake.settings.LakeSettings` holds the windows).

Two kinds of table:

- **streaming** (``master/events``, ``master/rejected``, ``master/arrivals``; the speed tables
  have their own window, ``SPEED_VACUUM_RETENTION_HOURS``): a commit every few seconds, read at
  their latest version. Their log is kept ``LAKE_LOG_RETENTION_HOURS`` (default 24): past it,
  every checkpoint deletes the older entries; left at Delta's 30 days, a 10-second trigger leaves
  ~260,000 log files.
- **history** (the batch views, coverage, drift, the view registry): a few commits an hour,
  read as of any time an analyst asks for; kept ``LAKE_HISTORY_RETENTION_HOURS`` (default 720,
  Delta's own 30 days). The application transactions a batch run commits with its time (its run
  id and one per hour it replaced: :mod:`lake.view_files`) expire after the same window
  (``delta.setTransactionRetentionDuration``): a rerun of a run older than that recomputes the
  same rows instead of committing nothing.

Data files no version within ``LAKE_VACUUM_RETENTION_HOURS`` (default 168) needs are deleted by
the maintenance DAG's VACUUM.
"""

from __future__ import annotations

from typing import Final

# Commits between two log checkpoints: expired entries are deleted when a checkpoint is written.
CHECKPOINT_INTERVAL: Final = 50
STREAMING_TABLES: Final = frozenset({"master/events", "master/rejected", "master/arrivals"})


def interval(hours: float) -> str:
    """A Delta table-property interval for ``hours`` (whole minutes, at least one)."""
    return f"interval {max(1, round(hours * 60))} minutes"


def retention_properties(
    *, log_hours: float, files_hours: float, transaction_hours: float | None = None
) -> dict[str, str]:
    """The table properties that keep ``log_hours`` of log and ``files_hours`` of files; with
    ``transaction_hours``, the application transactions that carry their time
    (``lastUpdated``) are forgotten past it (a batch view's run and hour ids,
    :mod:`lake.view_files`: without it, every run ever made would stay in every snapshot)."""
    properties = {
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
        "delta.logRetentionDuration": interval(log_hours),
        "delta.deletedFileRetentionDuration": interval(files_hours),
        "delta.enableExpiredLogCleanup": "true",
    }
    if transaction_hours is not None:
        properties["delta.setTransactionRetentionDuration"] = interval(transaction_hours)
    return properties
