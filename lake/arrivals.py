"""master/arrivals: what every archiver commit added to ``master/events``, as view rows.

The archiver appends, per micro-batch, its valid events counted per minute bucket and
dimensions (the view's own definition, ``views.ctr.ctr_arrow`` in each Spark task; a bucket and
dimensions can have a row per task, and duplicates within the batch count twice: readers sum),
in one delta-rs commit idempotent under the archiver's (query id, batch id)
(:mod:`lake.append_table`), with ``events_version``: a master/events version at or after the
commit that made those events readable. A batch run that read master/events at version V
counted every arrival with ``events_version <= V``; the arrivals of a covered bucket with a
later version are the events it has not counted yet (see :mod:`lake.staleness`). The batch
job deletes the arrivals its run counted, so the table holds only what may still be stale or
is not covered yet.

``events_version`` is read after the events commit, so it is never below the commit's version;
when a compaction commits in between it is one higher, which can only make a bucket look stale
once more than it is (one recompute too many), never the other way round.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from lake.append_table import AppendTable
from lake.catalog import MASTER_ARRIVALS
from lake.settings import LakeSettings
from runtime.formats import is_commit_conflict

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def arrival_rows(
    counts: pa.Table, *, events_version: int, batch_id: int, archived_at: dt.datetime
) -> pa.Table:
    """The arrivals of one archiver commit from ``counts``, the view rows of its valid events
    (:func:`views.ctr.ctr_arrow`, each task's rows): with the version that holds
    them, in ``master/arrivals``' schema."""
    n = counts.num_rows
    constants = {
        "events_version": pa.scalar(events_version, pa.int64()),
        "batch_id": pa.scalar(batch_id, pa.int64()),
        "archived_at": pa.scalar(archived_at, pa.timestamp("us", tz="UTC")),
    }
    rows = counts
    for name, value in constants.items():
        rows = rows.append_column(name, pa.repeat(value, n))
    return rows.select(MASTER_ARRIVALS.schema.names)


def arrivals_table(lake: LakeSettings) -> AppendTable:
    """``master/arrivals``, appended to by its one writer, the archiver."""
    return AppendTable(MASTER_ARRIVALS.path(lake), MASTER_ARRIVALS.schema)


def forget_counted(
    spark: SparkSession,
    lake: LakeSettings,
    *,
    where: str,
    input_version: int,
    attempts: int = 5,
) -> bool:
    """Delete the arrivals in ``where`` (SQL on ``bucket_start``, no user text) that a batch run
    reading master/events at ``input_version`` counted; False if the archiver's appends kept
    conflicting with the delete ``attempts`` times. Leaving them is safe: arrivals at or below
    a covering run's input version are never stale (:mod:`lake.staleness`), and the next run
    covering those minutes deletes them."""
    from delta.tables import DeltaTable

    path = MASTER_ARRIVALS.path(lake)
    if not DeltaTable.isDeltaTable(spark, path):
        return True
    condition = f"({where}) AND events_version <= {int(input_version)}"
    for attempt in range(1, attempts + 1):
        try:
            DeltaTable.forPath(spark, path).delete(condition)
        except Exception as exc:
            # delta-spark fails a delete when an append committed while it ran, although the
            # appended arrivals (newer versions) are not among the rows it deletes.
            if not is_commit_conflict(exc):
                raise
            time.sleep(0.2 * attempt)
        else:
            return True
    return False
