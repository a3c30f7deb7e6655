"""What a recompute would change, before it replaces anything (`ctr backfill --preview`, the
``preview`` param of ``ctr_batch``): the batch job's rows for an interval, computed as a run
would, against the rows the version's batch table holds there now, per minute bucket and
dimensions, as a :class:`views.comparison.Comparison`. Nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from batch_layer.interval import Interval
from batch_layer.job import compute_view
from lake.catalog import batch_table
from lake.settings import LakeSettings
from lake.storage import is_delta
from runtime.connectors import read_delta
from runtime.times import from_micros
from views.columns import DIMENSIONS
from views.comparison import Change, Comparison
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LARGEST: Final = 5


def preview(
    spark: SparkSession, interval: Interval, *, lake: LakeSettings, definition: Definition
) -> Comparison:
    """The rows of ``definition``'s batch table in ``interval`` now (side a) against its
    recompute from master/events at its current version (side b)."""
    from pyspark.sql import functions as F

    # Counts only: no reach (which would number the interval's users into the dictionary).
    after, version, *_ = compute_view(
        spark, interval, lake=lake, definition=definition, reach=False
    )
    path = batch_table(definition).path(lake)
    keys = ["bucket_start", *DIMENSIONS]
    if is_delta(path, lake.object_store):
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
        .withColumn("only_now", F.col("i_after").isNull())
        .withColumn("only_after", F.col("i_now").isNull())
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
            F.sum(F.col("only_now").cast("long")),
            F.sum(F.col("only_after").cast("long")),
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
    return Comparison(
        view=definition.key,
        a=f"{batch_table(definition).name} now",
        b=f"recomputed from master/events v{version}",
        start=interval.start,
        end=interval.end,
        rows_compared=int(total[0]),
        rows_changed=int(total[1] or 0),
        only_in_a=int(total[6] or 0),
        only_in_b=int(total[7] or 0),
        impressions=(int(total[2] or 0), int(total[3] or 0)),
        clicks=(int(total[4] or 0), int(total[5] or 0)),
        largest=tuple(
            Change(
                bucket_start=from_micros(r["us"]),
                dimensions={d: r[d] for d in DIMENSIONS},
                impressions=(int(r["i_now"]), int(r["i_after"])),
                clicks=(int(r["c_now"]), int(r["c_after"])),
            )
            for r in top
        ),
    )
