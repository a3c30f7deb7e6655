"""batch/coverage: which intervals a finished batch run made exact.

One row per run, appended only after the run's rows are committed to the view's table, so a
covered interval never points at rows that are not there.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lake.catalog import BATCH_COVERAGE
from lake.coverage import Coverage
from lake.settings import LakeSettings
from runtime.formats import write_delta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class CoverageRow:
    run_id: str
    view: str
    interval_start: dt.datetime
    interval_end: dt.datetime
    input_version: int
    rows_written: int
    finished_at: dt.datetime


def record(spark: SparkSession, path: str, row: CoverageRow) -> None:
    values = (
        row.run_id,
        row.view,
        row.interval_start,
        row.interval_end,
        row.input_version,
        row.rows_written,
        row.finished_at,
    )
    frame = spark.createDataFrame([values], BATCH_COVERAGE.spark_schema())
    # Keyed by run id: writing the same run's coverage again (a retry) is a no-op.
    write_delta(
        frame.coalesce(1),
        path,
        txn=(f"coverage:{row.run_id}:v{row.input_version}", 0),
    )


def read_coverage(lake: LakeSettings, view: str) -> Coverage:
    """The merged covered intervals of ``view`` (a version's key: ``ctr``, ``ctr@v2``), read
    with delta-rs (no Spark)."""
    from deltalake import DeltaTable

    path = BATCH_COVERAGE.path(lake)
    if not DeltaTable.is_deltatable(path):
        return Coverage(())
    rows = DeltaTable(path).to_pyarrow_table(columns=["view", "interval_start", "interval_end"])
    return Coverage(
        (r["interval_start"].astimezone(dt.UTC), r["interval_end"].astimezone(dt.UTC))
        for r in rows.to_pylist()
        if r["view"] == view
    )
