"""The click-through base view: impressions and clicks per minute and ad dimensions."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from views import sketches
from views.columns import DIMENSIONS, SKETCHES, USER_NUMBERS

if TYPE_CHECKING:
    import datetime as dt


def ctr(events: DataFrame, *, reach: bool = False, partitions: int | None = None) -> DataFrame:
    """Count impressions and clicks per one-minute event-time bucket and dimensions.

    Used as ``events.transform(ctr)`` by the batch job (on deduplicated events) and by the
    streaming job (after ``withWatermark("event_time", …)``): the bucket is a tumbling event-time
    window, which Structured Streaming can age out of its state.

    Parameters
    ----------
    events
        Columns ``event_time`` (timestamp), ``event_type`` ("impression" | "click") and the
        dimensions ``campaign_id``, ``ad_id``, ``site_id``, ``country``, ``device_type``.

    reach
        Also who the row reached (:func:`with_reach`; the events need ``user_id`` and
        ``user_no``, the user's number in the dictionary: :mod:`batch_layer.users`). Batch
        only: the rows are then counted in Arrow tasks after an exchange by the view's key.

    partitions
        With ``reach``, the partitions of that exchange (None: Spark's shuffle partitions).

    Returns
    -------
    DataFrame
        ``bucket_start`` (timestamp, start of the minute), the five dimensions, ``impressions``
        and ``clicks`` (long): one row per bucket and dimension combination that had events;
        with ``reach``, :data:`views.columns.SKETCHES` and :data:`views.columns.USER_NUMBERS`.

    Examples
    --------
    Two impressions and a click of one ad at 10:00:05, 10:00:59 and 10:01:00 give two rows:
    (10:00, …, impressions=2, clicks=0) and (10:01, …, impressions=0, clicks=1).
    """
    kind = F.col("event_type")
    if reach:
        counts = {
            "impressions": (kind == "impression").cast("long"),
            "clicks": (kind == "click").cast("long"),
        }
        rows = events.select(
            F.date_trunc("minute", "event_time").alias("bucket_start"),
            *DIMENSIONS,
            *(value.alias(name) for name, value in counts.items()),
            "event_type",
            "user_id",
            "user_no",
        )
        return with_reach(rows, list(counts), partitions)
    return (
        events.groupBy(F.window("event_time", "1 minute"), *DIMENSIONS)
        .agg(
            F.count(F.when(kind == "impression", 1)).alias("impressions"),
            F.count(F.when(kind == "click", 1)).alias("clicks"),
        )
        .select(F.col("window.start").alias("bucket_start"), *DIMENSIONS, "impressions", "clicks")
    )


def with_reach(rows: DataFrame, measures: Sequence[str], partitions: int | None) -> DataFrame:
    """The view's rows with who each reached: ``rows`` (one per event: ``bucket_start``, the
    dimensions, each of ``measures`` as a long, ``event_type``, ``user_id``, ``user_no``)
    summed per bucket and dimensions, with :data:`views.columns.SKETCHES` (HLL sketches of the
    distinct user ids of the group's impressions and clicks, in :mod:`views.sketches`' format;
    null ids are nobody) and :data:`views.columns.USER_NUMBERS` (the distinct ``user_no`` of
    each, sorted).

    Counted in Arrow tasks (:func:`group_arrow`) after an exchange by the view's key into
    ``partitions``: a collecting aggregate in Spark (``collect_set``, ``hll_sketch_agg``) turns
    its hash aggregation into a sort-based one, which cost 2.6x the view without reach on the
    10M-event benchmark, against 1.5x here (docs/performance.md). A task holds its partition's
    rows at once: the batch job exchanges into its dedup's partitions, sized by input bytes
    (:func:`batch_layer.job.dedup_partitions`); a group (one minute of one ad on one site,
    country and device) is never split.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    key = ["bucket_start", *DIMENSIONS]
    spread = rows.repartition(partitions, *key) if partitions else rows.repartition(*key)
    task = functools.partial(_reach_task, measures=tuple(measures))
    return spread.mapInArrow(task, from_arrow_schema(_reach_schema(measures)))


def _reach_task(
    batches: Iterator[pa.RecordBatch], *, measures: tuple[str, ...]
) -> Iterator[pa.RecordBatch]:
    held = list(batches)  # whole groups: the exchange was by their key
    rows = pa.Table.from_batches(held) if held else None
    if rows is not None and rows.num_rows:
        grouped = group_arrow(rows, measures, reach=True, numbered=True)
        yield from grouped.cast(_reach_schema(measures)).to_batches(_OUTPUT_BATCH_ROWS)


def _reach_schema(measures: Sequence[str]) -> pa.Schema:
    return pa.schema(
        [
            ("bucket_start", pa.timestamp("us", tz="UTC")),
            *((name, pa.string()) for name in DIMENSIONS),
            *((name, pa.int64()) for name in measures),
            *((name, pa.binary()) for name in SKETCHES),
            *((name, pa.list_(pa.int32())) for name in USER_NUMBERS),
        ]
    )


_OUTPUT_BATCH_ROWS = 50_000


def attributed_ctr(
    events: DataFrame,
    window: dt.timedelta,
    *,
    reach: bool = False,
    partitions: int | None = None,
) -> DataFrame:
    """Version 3's counts: clicks credited to their impression (``events.transform(…)`` on
    deduplicated events, in the batch layer).

    A click is credited to the impression it names (``impression_id``) when it happened at most
    ``window`` after it (and not before it); an impression id that several impression events
    carry is credited as its first (event time, then event id). Per minute bucket and
    dimensions:

    - ``impressions``: impression events in the bucket;
    - ``clicks``: the bucket's impressions with at least one credited click — in the
      *impression's* bucket and dimensions, so ``clicks <= impressions`` in every row;
    - ``repeat_clicks``: credited clicks after an impression's first one (impression's bucket);
    - ``orphan_clicks``: clicks credited to no impression (the click's bucket and dimensions);
    - ``raw_clicks``: every click event, in its own bucket (version 1's clicks).

    A row's buckets are exact when ``events`` hold every event from ``window`` before the
    bucket to ``window`` after it: the batch job reads an interval widened so on both sides
    and keeps the interval's rows.

    ``reach`` and ``partitions``: as :func:`ctr`'s (the per-event counts above are summed in
    :func:`with_reach`'s Arrow tasks).

    Examples
    --------
    An impression at 10:00:30 with clicks at 10:01:10 and 10:02:00 and a click at 10:05:00
    naming an impression never seen give (10:00, impressions=1, clicks=1, repeat_clicks=1),
    (10:01, raw_clicks=1), (10:02, raw_clicks=1) and (10:05, raw_clicks=1, orphan_clicks=1).
    """
    from pyspark.sql import Window

    # One pass over the events grouped by impression id (a window: every event of an
    # impression meets its impression there), then one aggregation per bucket and dimensions.
    # Measured on the 10M-event benchmark: a join of the clicks to the first impression per id
    # (an aggregation over every impression) read the deduplicated events four times, 3.2x
    # version 1's time.
    seconds = int(window.total_seconds())
    kind, time = F.col("event_type"), F.col("event_time")
    impression, click = kind == "impression", kind == "click"
    same_impression = Window.partitionBy("impression_id")
    first = F.min(F.when(impression, F.struct("event_time", "event_id"))).over(same_impression)
    shown_at = F.col("_first.event_time")
    credited = (
        click
        & shown_at.isNotNull()
        & (time >= shown_at)
        & (time <= shown_at + F.expr(f"INTERVAL {seconds} SECONDS"))
    )
    clicks_of_impression = F.sum(F.col("_credited").cast("long")).over(same_impression)
    marked = (
        events.withColumn("_first", first)
        .withColumn("_credited", credited)
        .withColumn("_n", clicks_of_impression)
    )
    # The first impression event of an id takes its credited clicks, in its own row's bucket
    # and dimensions; every other row counts only itself.
    takes = impression & (F.col("event_id") == F.col("_first.event_id")) & (F.col("_n") > 0)
    counts = {
        "impressions": impression.cast("long"),
        "clicks": takes.cast("long"),
        "raw_clicks": click.cast("long"),
        "orphan_clicks": (click & ~F.col("_credited")).cast("long"),
        "repeat_clicks": F.when(takes, F.col("_n") - 1).otherwise(0).cast("long"),
    }
    rows = marked.select(
        F.date_trunc("minute", time).alias("bucket_start"),
        *DIMENSIONS,
        *(value.alias(name) for name, value in counts.items()),
        *(["event_type", "user_id", "user_no"] if reach else []),
    )
    if reach:
        return with_reach(rows, list(counts), partitions)
    return rows.groupBy("bucket_start", *DIMENSIONS).agg(
        *(F.sum(name).cast("long").alias(name) for name in counts)
    )


def ctr_arrow(events: pa.Table, *, reach: bool = False, numbered: bool = False) -> pa.Table:
    """:func:`ctr` of events already in Arrow (in a Python task): the same rows (columns
    ``bucket_start``, the dimensions, ``impressions``, ``clicks``; any row order) without a
    Spark job. The archiver's tasks count their arrivals with it; a test holds the two
    definitions equal on the same events. ``reach`` (the speed layer): also
    :data:`views.columns.SKETCHES` (the events need ``user_id``); ``numbered``: also
    :data:`views.columns.USER_NUMBERS` (the events need ``user_no``).
    """
    kind = events.column("event_type")
    rows = {
        "bucket_start": pc.floor_temporal(events.column("event_time"), unit="minute"),
        **{name: events.column(name) for name in DIMENSIONS},
        "impressions": _ones_where(pc.equal(kind, "impression")),
        "clicks": _ones_where(pc.equal(kind, "click")),
    }
    if reach:
        rows.update(event_type=kind, user_id=events.column("user_id"))
    if numbered:
        rows.update(user_no=events.column("user_no"))
    return group_arrow(pa.table(rows), ("impressions", "clicks"), reach=reach, numbered=numbered)


def group_arrow(
    rows: pa.Table, measures: Sequence[str], *, reach: bool = False, numbered: bool = False
) -> pa.Table:
    """``rows`` (``bucket_start``, the dimensions, each of ``measures`` per row) summed per
    bucket and dimensions. ``reach``: the rows also hold ``event_type`` and ``user_id``, and
    the groups get :data:`views.columns.SKETCHES` (:func:`views.sketches.sketch` of the distinct
    ids of their impressions and of their clicks); ``numbered`` (with ``reach``): the rows also
    hold ``user_no``, and the groups get :data:`views.columns.USER_NUMBERS` (their distinct
    numbers, sorted)."""
    if numbered and not reach:
        raise ValueError("numbered needs reach (the numbers are of the users a row reached)")
    keys = ["bucket_start", *DIMENSIONS]
    columns = {name: rows.column(name) for name in (*keys, *measures)}
    aggregates = [(name, "sum") for name in measures]
    if reach:
        kind = rows.column("event_type")
        impression, click = pc.equal(kind, "impression"), pc.equal(kind, "click")
        sources = [("user_id", SKETCHES)] + ([("user_no", USER_NUMBERS)] if numbered else [])
        for source, (seen, clicked) in sources:
            values = rows.column(source)
            null = pa.nulls(rows.num_rows, values.type)
            columns[seen] = pc.if_else(impression, values, null)
            columns[clicked] = pc.if_else(click, values, null)
            aggregates += [(seen, "distinct"), (clicked, "distinct")]
    # One thread: it runs in Spark tasks, one per core already (Arrow's pool added a quarter
    # to the CPU time for the same wall time).
    summed = pa.table(columns).group_by(keys, use_threads=False).aggregate(aggregates)
    grouped = pa.table(
        {name: summed.column(name) for name in keys}
        | {name: summed.column(f"{name}_{function}") for name, function in aggregates}
    )
    if reach:
        for name in SKETCHES:
            users = grouped.column(name).to_pylist()
            sketched = pa.array([sketches.sketch(u) for u in users], pa.binary())
            grouped = grouped.set_column(grouped.schema.get_field_index(name), name, sketched)
    if numbered:
        for name in USER_NUMBERS:
            ordered = _sorted_lists(grouped.column(name))
            grouped = grouped.set_column(grouped.schema.get_field_index(name), name, ordered)
    return grouped.select([*keys, *measures, *(SKETCHES if reach else ()),
                           *(USER_NUMBERS if numbered else ())])  # fmt: skip


def _sorted_lists(lists: pa.ChunkedArray) -> pa.ListArray:
    """Each list of ``lists`` (no nulls in them) in ascending order, in one sort of all their
    values by (list, value)."""
    combined = lists.combine_chunks()
    values = combined.flatten()
    parents = pc.list_parent_indices(combined).to_numpy()
    order = np.lexsort((values.to_numpy(), parents))
    offsets = pc.subtract(combined.offsets, combined.offsets[0])
    return pa.ListArray.from_arrays(offsets, values.take(pa.array(order)))


def _ones_where(condition: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.cast(condition, pa.int64()), 0)
