"""The hour rows of a batch run: per hour the run covered whole, and combination of dimensions,
the hour's counts and who it reached, in ``batch/ctr_hours`` (``batch/ctr_vN_hours``).

The serving layer reads a day's reach from 24 hour rows per combination instead of 1,440 minute
rows: the exact distinct users as the union of the hours' bitmaps of user numbers
(:mod:`views.bitmaps`, numbers from the dictionary: :mod:`batch_layer.users`), the estimate as
the union of the hours' sketches (each the union of its minutes'). It uses an hour's rows only
while every minute row of that hour is the same run's (:mod:`serving_layer.hour_rows`), so a run
stopped between its two commits is never half-served.

Made from the run's own minute rows, read back by Spark's tasks (the drift reads them too),
exchanged by hour and combination and grouped in Arrow tasks (:func:`hour_rows`): the minute
rows' counts summed, their lists of user numbers (:data:`views.columns.USER_NUMBERS`, numbered
by the run before the view: :func:`batch_layer.job.compute_view`) gathered into a bitmap, their
sketches unioned. Written by the tasks, committed by the driver
(:func:`lake.view_files.replace_interval`: the hours the run touches are replaced, so an hour
it covered only in part keeps no hour row).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch_layer.interval import Interval
from lake import view_files
from lake.catalog import Table, hours_table
from lake.settings import LakeSettings
from views import bitmaps, sketches
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
    partitions: int | None = None,
    on_step: Callable[[str], None] = lambda step: None,
) -> HoursWritten:
    """Write the hour rows of the run ``run_id`` over ``interval`` from ``minutes``, its own
    minute rows (with user numbers: a run that measured reach), exchanged by the hour rows' key
    into ``partitions`` (None: Spark's shuffle partitions) and grouped by Arrow tasks
    (:func:`hour_batches`), each holding its partition's rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    table = hours_table(definition)
    keys = ["bucket_start", *DIMENSIONS]

    def gathered(whole: Interval) -> DataFrame:
        rows = minutes.where(whole.sql_predicate("bucket_start")).select(
            F.date_trunc("hour", "bucket_start").alias("bucket_start"),
            *DIMENSIONS,
            *_SUMMED,
            *USER_NUMBERS,
            *SKETCHES,
        )
        spread = rows.repartition(partitions, *keys) if partitions else rows.repartition(*keys)
        return spread.mapInArrow(
            functools.partial(hour_batches, run_id=run_id, schema=table.schema),
            from_arrow_schema(table.schema),
        )

    return replace_hours(
        spark, lake, table, interval, gathered, what="the hour rows",
        run_id=run_id, input_version=input_version, on_step=on_step,
    )  # fmt: skip


def hour_batches(
    batches: Iterator[pa.RecordBatch], *, run_id: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over minute rows exchanged by the hour rows' key (their
    ``bucket_start`` already the hour): the partition's hour rows (``schema``) of the run
    ``run_id`` (:func:`hour_rows`)."""
    held = list(batches)  # whole groups: the exchange was by their key
    if any(batch.num_rows for batch in held):
        yield from hour_rows(pa.Table.from_batches(held), run_id, schema).to_batches(
            _OUTPUT_BATCH_ROWS
        )


def hour_rows(minutes: pa.Table, run_id: str, schema: pa.Schema) -> pa.Table:
    """The hour rows (``schema``'s columns) of ``minutes``: minute rows whose ``bucket_start``
    is their hour, with :data:`views.columns.USER_NUMBERS` and :data:`views.columns.SKETCHES`.
    Per hour and combination: the counts summed, the lists of user numbers as one bitmap, the
    sketches unioned (a combination seen in one minute of the hour, most of them at real
    cardinality, keeps its minute's sketch as it is).

    Sorted by key in the task and grouped by where the key changes: a hash aggregation in Spark
    with ``collect_list`` and ``hll_union_agg`` is a sort-based one, 11-16 s of the 10M-event
    day's run (docs/performance.md)."""
    keys = ["bucket_start", *DIMENSIONS]
    ordered = minutes.take(pc.sort_indices(minutes, [(k, "ascending") for k in keys]))
    ordered = ordered.combine_chunks()
    starts = bitmaps.key_starts(ordered, keys)
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        name: ordered.column(name).take(pa.array(starts)) for name in keys
    }
    for name in _SUMMED:
        values = ordered.column(name).to_numpy(zero_copy_only=False)
        columns[name] = pa.array(np.add.reduceat(values, starts), pa.int64())
    columns["run_id"] = pa.array([run_id] * len(starts), pa.string())
    for numbers, bitmap in zip(USER_NUMBERS, USER_BITMAPS, strict=True):
        columns[bitmap] = bitmaps.group_bitmaps(ordered.column(numbers), starts)
    for name in SKETCHES:
        columns[name] = sketches.group_unions(ordered.column(name), starts)
    return pa.table(columns).select(schema.names).cast(schema)


_SUMMED: Final = ("impressions", "clicks")
_OUTPUT_BATCH_ROWS: Final = 50_000


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
