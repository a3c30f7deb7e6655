"""The reach cube of a batch run: per hour the run covered whole, and single dimension value
(a campaign, an ad, a site, a country, a device type) or the hour's whole traffic, who the hour
reached there, in ``batch/ctr_reach`` (``batch/ctr_vN_reach``).

Real traffic multiplies its dimensions into a combination for nearly every few events, so an
hour holds almost as many hour rows (:mod:`batch_layer.hours`) as minute rows, and a day's reach
per campaign from them unions millions of bitmaps of one or two users each. The dashboard and
most API queries group by one dimension, or none, and filter on it: for those the serving layer
unions a few hundred of these rows a day instead (:mod:`serving_layer.reach_cube`), as Pinot's
star-tree and Druid's rollup pre-aggregate along the dimensions people group by. Queries that
group or filter by two dimensions still read the hour and minute rows, exactly.

Made from the run's own minute rows: each row stacked once per dimension and once for the whole
(``dimension`` and ``value`` ``*``), exchanged by key and sorted within the partitions, and
each key's lists of user numbers gathered into a bitmap by an Arrow task that streams
(:func:`views.bitmaps.union_sorted`): no Spark aggregation of lists, one bitmap in memory per
key at a time. Written by the tasks, committed by the driver after the hour rows, replacing the
hours the run touches, as the hour rows are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from batch_layer.hours import HoursWritten, replace_hours
from batch_layer.interval import Interval
from lake.catalog import reach_cube_table
from lake.settings import LakeSettings
from views import bitmaps
from views.columns import DIMENSIONS, USER_BITMAPS, USER_NUMBERS
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The dimension and value of a row counting the hour's whole traffic.
WHOLE: Final = "*"
KEYS: Final = ("bucket_start", "dimension", "value")


def write_reach_cube(  # noqa: PLR0913 - keyword-only options of one write
    spark: SparkSession,
    lake: LakeSettings,
    minutes: DataFrame,
    interval: Interval,
    *,
    definition: Definition,
    run_id: str,
    input_version: int,
    on_step: Callable[[str], None] = lambda step: None,
) -> HoursWritten:
    """Write the reach cube of the run ``run_id`` over ``interval`` from ``minutes``, its own
    minute rows (with user numbers: a run that measured reach)."""
    return replace_hours(
        spark, lake, reach_cube_table(definition), interval,
        lambda whole: cube_rows(minutes.where(whole.sql_predicate("bucket_start")), run_id),
        what="the reach cube", run_id=run_id, input_version=input_version, on_step=on_step,
    )  # fmt: skip


def cube_rows(minutes: DataFrame, run_id: str) -> DataFrame:
    """The reach cube's rows (the table's columns) of ``minutes``, whole hours' minute rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    per_value = [F.struct(F.lit(d).alias("dimension"), F.col(d).alias("value")) for d in DIMENSIONS]
    whole = F.struct(F.lit(WHOLE).alias("dimension"), F.lit(WHOLE).alias("value"))
    stacked = minutes.select(
        F.date_trunc("hour", "bucket_start").alias("bucket_start"),
        F.inline(F.array(*per_value, whole)),
        *USER_NUMBERS,
    )
    unioned = pa.schema(
        [
            ("bucket_start", pa.timestamp("us", tz="UTC")),
            ("dimension", pa.string()),
            ("value", pa.string()),
            *((name, pa.binary()) for name in USER_NUMBERS),
        ]
    )
    return (
        stacked.repartition(*KEYS)
        .sortWithinPartitions(*KEYS)
        .mapInArrow(
            functools.partial(bitmaps.union_sorted, keys=KEYS, columns=USER_NUMBERS),
            from_arrow_schema(unioned),
        )
        .select(
            *KEYS,
            F.lit(run_id).alias("run_id"),
            *(F.col(n).alias(b) for n, b in zip(USER_NUMBERS, USER_BITMAPS, strict=True)),
        )
    )
