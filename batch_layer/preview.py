"""What a recompute would change, before it replaces anything (`ctr backfill --preview`, the
``preview`` param of ``ctr_batch``): the batch job's rows for an interval, computed as a run
would, against the rows the version's batch table holds there now, per minute bucket and
dimensions. Nothing is written.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from batch_layer.interval import Interval
from batch_layer.job import compute_view
from lake.catalog import batch_table
from lake.settings import LakeSettings
from runtime.formats import read_delta
from views.columns import DIMENSIONS
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LARGEST: Final = 5


@dataclass(frozen=True)
class Preview:
    interval: Interval
    input_version: int
    rows_compared: int
    rows_changed: int
    impressions: tuple[int, int]  # (now, after the recompute)
    clicks: tuple[int, int]
    largest: tuple[tuple[dt.datetime, dict[str, str], tuple[int, int], tuple[int, int]], ...]


def preview(
    spark: SparkSession, interval: Interval, *, lake: LakeSettings, definition: Definition
) -> Preview:
    """The recompute of ``interval`` for ``definition`` against the table's rows now."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    after, version, _ = compute_view(spark, interval, lake=lake, definition=definition)
    path = batch_table(definition).path(lake)
    keys = ["bucket_start", *DIMENSIONS]
    if DeltaTable.is_deltatable(path):
        now = read_delta(spark, path).where(interval.sql_predicate("bucket_start"))
    else:
        now = after.limit(0)
    joined = (
        now.select(*keys, F.col("impressions").alias("i_now"), F.col("clicks").alias("c_now"))
        .join(
            after.select(
                *keys, F.col("impressions").alias("i_after"), F.col("clicks").alias("c_after")
            ),
            on=keys,  # the dimensions are never null (validated events)
            how="full_outer",
        )
        .fillna(0, subset=["i_now", "c_now", "i_after", "c_after"])
        .withColumn(
            "changed", (F.col("i_now") != F.col("i_after")) | (F.col("c_now") != F.col("c_after"))
        )
        .withColumn(
            "size",
            F.abs(F.col("i_after") - F.col("i_now")) + F.abs(F.col("c_after") - F.col("c_now")),
        )
        .persist()
    )
    try:
        total = joined.agg(
            F.count(F.lit(1)),
            F.sum(F.col("changed").cast("long")),
            F.sum("i_now"),
            F.sum("i_after"),
            F.sum("c_now"),
            F.sum("c_after"),
        ).collect()[0]
        top = (
            joined.where("changed")
            .orderBy(F.col("size").desc(), *keys)
            .limit(LARGEST)
            .select(
                F.unix_micros("bucket_start").alias("us"),
                *DIMENSIONS,
                "i_now",
                "i_after",
                "c_now",
                "c_after",
            )
            .collect()
        )
    finally:
        joined.unpersist()
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return Preview(
        interval=interval,
        input_version=version,
        rows_compared=int(total[0]),
        rows_changed=int(total[1] or 0),
        impressions=(int(total[2] or 0), int(total[3] or 0)),
        clicks=(int(total[4] or 0), int(total[5] or 0)),
        largest=tuple(
            (
                epoch + dt.timedelta(microseconds=r["us"]),
                {d: r[d] for d in DIMENSIONS},
                (int(r["i_now"]), int(r["i_after"])),
                (int(r["c_now"]), int(r["c_after"])),
            )
            for r in top
        ),
    )
