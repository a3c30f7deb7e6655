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

Made from the run's own minute rows in two steps of Arrow tasks, no Spark aggregation of lists:
each task cubes its own rows (per hour and dimension value, and per hour for the whole:
``dimension`` and ``value`` ``*``), their lists of user numbers into one bitmap per key
(:func:`partial_cube`); those few rows are exchanged and sorted by key, and each key's bitmaps
unioned as they stream past (:func:`union_cube_batches`). Stacking every minute row six times
and sorting them by key in Spark took 17-20 s of the 10M-event day's run (docs/performance.md).
Written by the tasks, committed by the driver after the hour rows, replacing the hours the run
touches, as the hour rows are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

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
# Minute rows a task cubes at once: the more, the fewer partial rows to exchange; bounded, so a
# task's memory does not grow with its input.
PARTIAL_ROWS: Final = 500_000
_PARTIAL: Final = pa.schema(
    [
        ("bucket_start", pa.timestamp("us", tz="UTC")),
        ("dimension", pa.string()),
        ("value", pa.string()),
        *((name, pa.binary()) for name in USER_BITMAPS),
    ]
)


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
    """The reach cube's rows (the table's columns) of ``minutes``, whole hours' minute rows:
    each task's rows cubed where they are (:func:`partial_cube_batches`), the partial cubes
    exchanged and sorted by key (a few rows per task, hour and dimension value) and unioned
    (:func:`union_cube_batches`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    hours = minutes.select(
        F.date_trunc("hour", "bucket_start").alias("bucket_start"), *DIMENSIONS, *USER_NUMBERS
    )
    schema = from_arrow_schema(_PARTIAL)
    return (
        hours.mapInArrow(partial_cube_batches, schema)
        .repartition(*KEYS)
        .sortWithinPartitions(*KEYS)
        .mapInArrow(union_cube_batches, schema)
        .select(*KEYS, F.lit(run_id).alias("run_id"), *USER_BITMAPS)
    )


def partial_cube_batches(
    batches: Iterator[pa.RecordBatch], at_once: int = PARTIAL_ROWS
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over minute rows (``bucket_start`` their hour, the dimensions,
    :data:`views.columns.USER_NUMBERS`): the cube of each ``at_once`` rows of them or more
    (:func:`partial_cube`), a few rows per hour and dimension value."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        held.append(batch)
        rows += batch.num_rows
        if rows >= at_once:
            yield from partial_cube(pa.Table.from_batches(held)).to_batches()
            held, rows = [], 0
    if rows:
        yield from partial_cube(pa.Table.from_batches(held)).to_batches()


def partial_cube(minutes: pa.Table) -> pa.Table:
    """The cube (:data:`_PARTIAL`'s columns) of ``minutes``: per hour and each dimension's
    value, and per hour for the whole (:data:`WHOLE`), the bitmaps of every number of their
    rows. Grouped by sorting the keys in the task: one Python call per key, not per row."""
    parts = []
    for dimension in (*DIMENSIONS, WHOLE):
        values = (
            minutes.column(dimension)
            if dimension != WHOLE
            else pa.array([WHOLE] * minutes.num_rows, pa.string())
        )
        keyed = pa.table({"bucket_start": minutes.column("bucket_start"), "value": values})
        order = pc.sort_indices(keyed, [("bucket_start", "ascending"), ("value", "ascending")])
        keyed = keyed.take(order).combine_chunks()
        starts = bitmaps.key_starts(keyed, ("bucket_start", "value"))
        first = pa.array(starts)
        part = {
            "bucket_start": keyed.column("bucket_start").take(first),
            "dimension": pa.array([dimension] * len(starts), pa.string()),
            "value": keyed.column("value").take(first),
        }
        for numbers, bitmap in zip(USER_NUMBERS, USER_BITMAPS, strict=True):
            part[bitmap] = bitmaps.group_bitmaps(minutes.column(numbers).take(order), starts)
        parts.append(pa.table(part).cast(_PARTIAL))
    return pa.concat_tables(parts)


def union_cube_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over partial cubes exchanged by key and sorted by it: one row per
    key, its bitmaps the union of its partial ones. Streams: one key's union is held at a
    time, whatever the number of tasks whose partial rows meet there (every task's rows of an
    hour meet in its whole-traffic key)."""
    current: tuple[object, ...] | None = None
    held: list[BitMap] = []
    done: list[tuple[tuple[object, ...], list[bytes]]] = []
    for batch in batches:
        if not batch.num_rows:
            continue
        starts = bitmaps.key_starts(batch, KEYS)
        first = pa.array(starts)
        keys = list(zip(*(batch.column(k).take(first).to_pylist() for k in KEYS), strict=True))
        columns = [batch.column(name).to_pylist() for name in USER_BITMAPS]
        bounds = [*starts.tolist(), batch.num_rows]
        for key, begin, end in zip(keys, bounds[:-1], bounds[1:], strict=True):
            if key != current:
                if current is not None:
                    done.append((current, [bytes(b.serialize()) for b in held]))
                current, held = key, [BitMap() for _ in USER_BITMAPS]
            for union, values in zip(held, columns, strict=True):
                union.update(*(BitMap.deserialize(v) for v in values[begin:end] if v is not None))
        if done:
            yield _cube_batch(done)
            done = []
    if current is not None:
        yield _cube_batch([(current, [bytes(b.serialize()) for b in held])])


def _cube_batch(rows: list[tuple[tuple[object, ...], list[bytes]]]) -> pa.RecordBatch:
    columns = [[key[i] for key, _ in rows] for i in range(len(KEYS))]
    columns += [[unions[j] for _, unions in rows] for j in range(len(USER_BITMAPS))]
    return pa.RecordBatch.from_arrays(
        [pa.array(values, field.type) for values, field in zip(columns, _PARTIAL, strict=True)],
        schema=_PARTIAL,
    )
