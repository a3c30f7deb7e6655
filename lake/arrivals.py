"""master/arrivals: what every archiver commit added to ``master/events``, as view rows.

The archiver appends, per micro-batch, its valid events counted per minute bucket and
dimensions (the view's own definition, ``views.ctr.ctr_arrow`` in each Spark task; a bucket and
dimensions can have a row per task, and duplicates within the batch count twice: readers sum),
in one delta-rs commit idempotent under the archiver's (query id, batch id)
(:mod:`lake.append_table`), with ``events_version``: a master/events version at or after the
commit that made those events readable. A batch run that read master/events at version V
counted every arrival with ``events_version <= V``; the arrivals of a covered bucket with a
later version are the events it has not counted yet (see :mod:`lake.coverage.staleness`). The batch
job deletes the arrivals its run counted, so the table holds only what may still be stale or
is not covered yet (with delta-rs, beside the archiver's appends: :func:`_delete`).

``events_version`` is read after the events commit, so it is never below the commit's version;
when a compaction commits in between it is one higher, which can only make a bucket look stale
once more than it is (one recompute too many), never the other way round.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

import pyarrow as pa

from lake.append_table import AppendTable
from lake.catalog import MASTER_ARRIVALS
from lake.coverage.log import read_runs
from lake.coverage.model import delta_rs_timestamp, in_intervals_sql
from lake.settings import LakeSettings
from lake.storage import is_delta, open_delta
from runtime.object_store import ObjectStoreSettings

log = logging.getLogger("ctr.lake")


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
    return AppendTable(
        MASTER_ARRIVALS.path(lake),
        lake.object_store,
        MASTER_ARRIVALS.schema,
        properties=lake.retention(MASTER_ARRIVALS.name),
    )


def forget_counted(
    lake: LakeSettings,
    *,
    start: dt.datetime,
    end: dt.datetime,
    input_version: int,
    attempts: int = 5,
) -> bool:
    """Delete the arrivals of buckets in [``start``, ``end``) that a batch run reading
    master/events at ``input_version`` counted; False if the delete kept conflicting with
    another writer's commit ``attempts`` times. Leaving them is safe: arrivals at or below a
    covering run's input version are never stale (:mod:`lake.coverage.staleness`), and the next run
    covering those minutes deletes them."""
    condition = f"{_in_range(start, end)} AND events_version <= {int(input_version)}"
    return _delete(MASTER_ARRIVALS.path(lake), lake.object_store, condition, attempts)


def forget_settled(
    lake: LakeSettings,
    *,
    view: str,
    start: dt.datetime,
    end: dt.datetime,
    window: dt.timedelta,
    attempts: int = 5,
) -> bool:
    """:func:`forget_counted` for a version with click attribution (``view``, its key), after
    its run over [start, end): an arrival changes the buckets up to ``window`` either side of
    its own (:func:`lake.coverage.staleness.stale_marks_sql`), so it is deleted only once every
    covered bucket in that reach was recomputed from a master/events version that holds it. Looks at
    the arrivals up to ``window`` around the interval (those the run may have settled for its
    neighbours too); the arrivals of buckets no run covers stay. False if the delete kept
    conflicting."""
    minute = dt.timedelta(minutes=1)
    reach = -(-window // minute)
    first = start - 2 * reach * minute
    versions = read_runs(lake).input_versions(view, first, end + 2 * reach * minute)
    # Consecutive minutes with the same bound become one range: a few terms per run.
    ranges: list[tuple[int, int, int]] = []  # (first minute, end minute, bound)
    for i in range(reach, len(versions) - reach):
        near = [v for v in versions[i - reach : i + reach + 1] if v is not None]
        if versions[i] is None:  # a bucket no run covers keeps its arrivals
            continue
        bound = min(near)
        if ranges and ranges[-1][1] == i and ranges[-1][2] == bound:
            ranges[-1] = (ranges[-1][0], i + 1, bound)
        else:
            ranges.append((i, i + 1, bound))
    condition = [
        f"({_in_range(first + lo * minute, first + hi * minute)} AND events_version <= {bound})"
        for lo, hi, bound in ranges
    ]
    if not condition:
        return True
    return _delete(MASTER_ARRIVALS.path(lake), lake.object_store, " OR ".join(condition), attempts)


def _in_range(start: dt.datetime, end: dt.datetime) -> str:
    return in_intervals_sql("bucket_start", [(delta_rs_timestamp(start), delta_rs_timestamp(end))])


def _delete(path: str, store: ObjectStoreSettings, condition: str, attempts: int) -> bool:
    """Delete the rows of ``condition`` with delta-rs, ``attempts`` times at most.

    Not delta-spark: its DELETE conflicts with any append committed while it runs (the
    archiver's, every few seconds) and took longer than that on a busy machine, so in make
    soak every clean-up gave up and master/arrivals grew without bound. delta-rs's delete takes
    a fraction of a second and checks the appended files against its predicate by their
    statistics (newer ``events_version``: no conflict); a compaction by the archiver that
    removed the same files does conflict, and the delete is tried again."""
    from deltalake.exceptions import CommitFailedError

    if not is_delta(path, store):
        return True
    for attempt in range(1, attempts + 1):
        try:
            open_delta(path, store).delete(condition)
        except CommitFailedError as exc:
            log.info("master/arrivals clean-up conflicted (attempt %d): %s", attempt, exc)
            time.sleep(0.2 * attempt)
        else:
            return True
    return False
