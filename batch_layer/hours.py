"""The hour rows of a batch run: per hour the run covered whole, and combination of dimensions,
the hour's counts and who it reached, in ``batch/ctr_hours`` (``batch/ctr_vN_hours``).

The serving layer reads a day's reach from 24 hour rows per combination instead of 1,440 minute
rows: the exact distinct users as the union of the hours' bitmaps of user numbers
(:mod:`views.bitmaps`, numbers from the dictionary: :mod:`batch_layer.users`), the estimate as
the union of the hours' sketches (each the union of its minutes'). It uses an hour's rows only
while every minute row of that hour is the same run's (:mod:`serving_layer.hour_rows`), so a run
stopped between its two commits is never half-served.

Made from the run's own minute rows, read back by Spark's tasks (the drift reads them too), in
one aggregation per hour and combination: the minute rows' counts summed, their lists of user
numbers (:data:`views.columns.USER_NUMBERS`, numbered by the run before the view:
:func:`batch_layer.job.compute_view`) gathered into a bitmap, their sketches unioned
(``hll_union_agg``). Written by the tasks, committed by the driver
(:func:`lake.view_files.replace_interval`: the hours the run touches are replaced, so an hour
it covered only in part keeps no hour row).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from batch_layer.interval import Interval
from lake import view_files
from lake.catalog import Table, hours_table
from lake.settings import LakeSettings
from views import bitmaps
from views.columns import DIMENSIONS, SKETCHES, USER_BITMAPS, USER_NUMBERS
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_HOUR = dt.timedelta(hours=1)


class HoursWritten(NamedTuple):
    committed: bool  # False: nothing to write, or the run's hour rows were committed before
    hours: int  # whole hours the run covered
    rows: int


def whole_hours(interval: Interval) -> Interval | None:
    """The whole hours of ``interval`` (None: it holds none)."""
    start = _floor(interval.start)
    if start < interval.start:
        start += _HOUR
    end = _floor(interval.end)
    return Interval(start, end) if start < end else None


def hours_touched(interval: Interval) -> Interval:
    """The hours ``interval`` touches, whole: those its run replaces in the hour table."""
    end = _floor(interval.end)
    return Interval(_floor(interval.start), end if end == interval.end else end + _HOUR)


def write_hours(  # noqa: PLR0913 - keyword-only options of one write
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
    """Write the hour rows of the run ``run_id`` over ``interval`` from ``minutes``, its own
    minute rows (with user numbers: a run that measured reach)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    table = hours_table(definition)

    def gathered(whole: Interval) -> DataFrame:
        rows = (
            minutes.where(whole.sql_predicate("bucket_start"))
            .groupBy(F.date_trunc("hour", "bucket_start").alias("bucket_start"), *DIMENSIONS)
            .agg(
                F.sum("impressions").alias("impressions"),
                F.sum("clicks").alias("clicks"),
                F.lit(run_id).alias("run_id"),
                *(
                    F.flatten(F.collect_list(numbers)).alias(bitmap)
                    for numbers, bitmap in zip(USER_NUMBERS, USER_BITMAPS, strict=True)
                ),
                *(F.hll_union_agg(name).alias(name) for name in SKETCHES),
            )
        )
        return rows.mapInArrow(
            functools.partial(bitmaps.bitmap_batches, columns=USER_BITMAPS),
            from_arrow_schema(pa.schema([table.schema.field(n) for n in table.schema.names])),
        )

    return replace_hours(
        spark, lake, table, interval, gathered, what="the hour rows",
        run_id=run_id, input_version=input_version, on_step=on_step,
    )  # fmt: skip


def replace_hours(  # noqa: PLR0913 - keyword-only options of one write
    spark: SparkSession,
    lake: LakeSettings,
    table: Table,
    interval: Interval,
    rows_of: Callable[[Interval], DataFrame],
    *,
    what: str,
    run_id: str,
    input_version: int,
    on_step: Callable[[str], None],
) -> HoursWritten:
    """Replace the hours ``interval`` touches in ``table`` (rows per whole hour: the hour rows,
    the reach cube) with ``rows_of`` its whole hours, as the run ``run_id``; nothing when the
    run committed them before."""
    path = table.path(lake)
    whole = whole_hours(interval)
    existing = view_files.open_table(path, lake.object_store, table.schema)
    if existing.transaction_version(run_id) is not None:
        return HoursWritten(False, 0, 0)
    rows = spark.createDataFrame([], table.spark_schema()) if whole is None else rows_of(whole)
    on_step(f"writing {what} of {whole or 'no whole hour'} to {table.name}")
    replaced = view_files.replace_interval(
        spark,
        rows,
        name=table.name,
        path=path,
        store=lake.object_store,
        schema=table.schema,
        interval=hours_touched(interval),
        run_id=run_id,
        input_version=input_version,
        properties=lake.retention(table.name),
    )
    hours = int((whole.end - whole.start) / _HOUR) if whole else 0
    return HoursWritten(replaced.committed, hours, replaced.rows)


def _floor(moment: dt.datetime) -> dt.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)
