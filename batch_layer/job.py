"""The batch job: recompute the CTR view of one interval exactly, from the master dataset.

Reads ``master/events`` at its current version for the interval (partition pruning on
``event_date``, then ``event_time`` in [start, end)), keeps one row per ``event_id``, applies the
shared view, and replaces exactly that interval of ``batch/ctr`` in one atomic commit. Only then
does it append a row to ``batch/coverage``. Rerunning an interval gives the same rows; events
that arrived late are counted whenever their interval is recomputed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from lake.catalog import BATCH_COVERAGE, BATCH_CTR
from lake.coverage_log import CoverageRow, record
from lake.settings import LakeSettings
from runtime.formats import read_delta, write_delta
from views.ctr import ctr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VIEW = "ctr"


class MissingTableError(LookupError):
    """The master dataset is not there yet."""


@dataclass(frozen=True)
class BatchRun:
    run_id: str
    interval: Interval
    input_version: int
    rows_written: int


def deduplicate(events: DataFrame) -> DataFrame:
    """One row per event_id: the first one archived (lowest ingest time, then Kafka
    partition and offset), so the choice does not depend on how Spark splits the work.

    Measured on the 10M-event benchmark (2 cores), dedup plus view: this window 19-24 s;
    ``min`` of a struct per id 25 s, ``dropDuplicates`` 27 s (and not deterministic), only the
    repeated ids through the window (a hash aggregate over the ids, then anti and semi joins)
    39 s; the view's aggregation alone takes 11-12 s.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = Window.partitionBy("event_id").orderBy("ingest_time", "kafka_partition", "kafka_offset")
    return events.withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n")


def run(
    spark: SparkSession,
    interval: Interval,
    *,
    lake: LakeSettings,
    run_id: str | None = None,
    on_step: Callable[[str], None] = lambda step: None,
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
) -> BatchRun:
    """Recompute ``batch/ctr`` for ``interval`` and record the coverage."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.is_deltatable(lake.events):
        raise MissingTableError(
            f"master/events does not exist at {lake.events}: run `ctr archive` first "
            "(or point LAKE_ROOT at the lake)"
        )
    version = DeltaTable(lake.events).version()
    # Same interval and same input version -> same run id: a rerun writes identical rows.
    run_id = run_id or f"{VIEW}-{interval.start:%Y%m%dT%H%M}-{interval.end:%Y%m%dT%H%M}-v{version}"
    on_step(f"reading master/events v{version} for {interval}")
    events = read_delta(
        spark,
        lake.events,
        version=version,
        partitions={"event_date": [d.isoformat() for d in interval.days]},
    ).where(interval.sql_predicate("event_time"))
    view = deduplicate(events).transform(ctr).withColumn("run_id", F.lit(run_id))
    view = view.persist()
    try:
        on_step("computing the view")
        rows = view.count()
        on_step(f"replacing {interval} of batch/ctr with {rows:,} rows")
        write_delta(
            view,
            BATCH_CTR.path(lake),
            mode="overwrite",
            replace_where=interval.sql_predicate("bucket_start"),
        )
    finally:
        view.unpersist()
    on_step("recording coverage")
    record(
        spark,
        BATCH_COVERAGE.path(lake),
        CoverageRow(run_id, VIEW, interval.start, interval.end, version, rows, clock()),
    )
    return BatchRun(run_id, interval, version, rows)
