"""What the speed layer had counted, next to the exact counts: ``batch/drift``, recorded by a
batch run for the minutes it covers for the first time (the speed rows of a covered minute are
pruned soon after, so this is the last moment both are there). The serving layer summarises it
(:mod:`serving_layer.inventory`), the dashboard plots it.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from lake.catalog import BATCH_DRIFT, SPEED_CTR, SPEED_LATE
from lake.coverage import log as coverage_log
from lake.coverage.model import Coverage
from lake.frames import commit_frame
from lake.settings import LakeSettings
from lake.storage import is_delta
from runtime.connectors import read_delta
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def record_drift(
    spark: SparkSession,
    lake: LakeSettings,
    view: DataFrame,
    interval: Interval,
    *,
    definition: Definition,
    run_id: str,
    at: dt.datetime,
) -> int:
    """Append to ``batch/drift``, per minute of ``interval`` that no run covered before and the
    speed layer saw (counted in ``speed/ctr``, or dropped as later than its watermark into
    ``speed/late``), the speed and the batch counts; returns the minutes recorded.

    Idempotent per interval. Minutes covered before are left out: their speed rows (if any) hold
    only what arrived after the speed layer's pruning, not its estimate of the bucket."""
    from pyspark.sql import functions as F

    speed_path, late_path = SPEED_CTR.path(lake), SPEED_LATE.path(lake)
    if not is_delta(speed_path, lake.object_store):
        return 0
    before = coverage_log.read_runs(lake).of(definition.key)
    fresh = Coverage(before.gaps(interval.start, interval.end))
    if not fresh.intervals:
        return 0
    in_fresh = fresh.sql_predicate("bucket_start")
    if definition.where:  # the speed layer counts every event; this version counts fewer
        in_fresh = f"{in_fresh} AND ({definition.where})"
    # The speed layer's estimate of the version's clicks: its credited clicks for a version
    # with attribution (null in rows written before it counted them).
    speed = read_delta(spark, speed_path)
    speed_clicks = (
        F.coalesce(F.col("attributed_clicks"), F.lit(0))
        if definition.attribution is not None and "attributed_clicks" in speed.columns
        else F.col("clicks")
    )
    counted = (
        speed.where(in_fresh)
        .groupBy("bucket_start")
        .agg(
            F.sum("impressions").alias("speed_impressions"),
            F.sum(speed_clicks).alias("speed_clicks"),
        )
    )
    seen = counted.select("bucket_start")
    if is_delta(late_path, lake.object_store):
        late_fresh = fresh.sql_predicate("bucket_start")  # speed/late has no dimensions
        seen = seen.union(read_delta(spark, late_path).where(late_fresh).select("bucket_start"))
    batch = view.groupBy("bucket_start").agg(
        F.sum("impressions").alias("batch_impressions"), F.sum("clicks").alias("batch_clicks")
    )
    zero = F.lit(0)
    drift = (
        seen.distinct()
        .join(counted, "bucket_start", "left")
        .join(batch, "bucket_start", "left")
        .select(
            F.lit(run_id).alias("run_id"),
            F.lit(definition.key).alias("view"),
            "bucket_start",
            *(
                F.coalesce(column, zero).cast("long").alias(column)
                for column in (
                    "speed_impressions",
                    "speed_clicks",
                    "batch_impressions",
                    "batch_clicks",
                )
            ),
            F.lit(at).cast("timestamp").alias("recorded_at"),
        )
        .coalesce(1)
        .persist()
    )
    try:
        minutes = drift.count()
        if minutes:
            # Keyed by interval: a run retried after a conflict (another run id) adds no rows.
            key = f"drift:{definition.key}:{interval.start:%Y%m%dT%H%M}-{interval.end:%Y%m%dT%H%M}"
            commit_frame(
                drift,
                BATCH_DRIFT.path(lake),
                lake.object_store,
                BATCH_DRIFT.schema,
                txn=(key, 0),
                properties=lake.retention(BATCH_DRIFT.name),
            )
        return minutes
    finally:
        drift.unpersist()
