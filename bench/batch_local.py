"""The batch benchmark's measured parts for issue 71: a dedup without an exchange (a candidate
the job does not use yet), and reach counted in Arrow tasks (the job's since 2026-11-30)
against Spark's own aggregates (the job's before).

A record's Kafka key is its impression id, so the copies of one event share their Kafka
partition: a task that holds every row of one Kafka partition of the interval can keep the
first copy of each event alone, without Spark's exchange and sort of every row by event_id.
master/events does not keep that locality (the archiver's tasks take a core's share of a
micro-batch across partitions, and its compaction merges their files), so the benchmark
measures it over a copy of the day's files sorted by Kafka partition, a row group per
partition (the layout the archiver and its compaction would have to write), and over the
table's own files (each task then decodes every row group to keep a partition's rows).

Each task (a Python task over Arrow, one per Kafka partition) reads the row groups whose
statistics hold its partition, keeps the interval's rows of its partition, and the first copy
of each event id (lowest ingest time, then Kafka partition and offset: the job's rule,
:func:`batch_layer.job.deduplicate`); then either hands the rows to Spark, whose view
aggregates them (:func:`views.ctr.ctr`), or counts its partial view in Arrow
(:func:`views.ctr.ctr_arrow`) and Spark sums the partial rows.

Reach (:func:`reach_parts`): the job's Arrow tasks (:func:`views.ctr.with_reach`) against
Spark's collecting aggregates (``collect_set``, ``hll_sketch_agg``: :func:`spark_reach`), which
turn its hash aggregation into a sort-based one; the two are checked to give the same rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from views import sketches
from views.columns import DIMENSIONS, SKETCHES, USER_NUMBERS
from views.ctr import ctr, ctr_arrow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from batch_layer.interval import Interval
    from lake.settings import LakeSettings

READ = [
    "event_id", "event_type", "event_time", *DIMENSIONS,
    "ingest_time", "kafka_partition", "kafka_offset",
]  # fmt: skip


def sorted_copy(files: Sequence[str], into: Path) -> list[str]:
    """Each of ``files`` rewritten under ``into`` sorted by Kafka partition and offset, one
    row group per partition (whose statistics then name that partition alone)."""
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for number, file in enumerate(files):
        table = pq.read_table(file, columns=READ).sort_by(
            [("kafka_partition", "ascending"), ("kafka_offset", "ascending")]
        )
        partitions = table.column("kafka_partition").to_numpy()
        target = into / f"part-{number:05d}.parquet"
        with pq.ParquetWriter(target, table.schema) as writer:
            for partition in np.unique(partitions):
                low, high = np.searchsorted(partitions, [partition, partition + 1])
                writer.write_table(table.slice(low, high - low))
        written.append(str(target))
    return written


def first_per_id(events: pa.Table) -> pa.Table:
    """The first copy of each ``event_id`` (lowest ``ingest_time``, then ``kafka_partition``
    and ``kafka_offset``): the ids hashed to codes, and only the rows of repeated codes
    sorted."""
    codes = pc.dictionary_encode(events.column("event_id")).combine_chunks().indices.to_numpy()
    repeated = np.flatnonzero(np.bincount(codes)[codes] > 1)
    if not len(repeated):
        return events

    def column(name: str) -> np.ndarray:
        values = events.column(name).take(repeated)
        if pa.types.is_timestamp(values.type):
            values = pc.cast(values, pa.int64())
        found: np.ndarray = values.to_numpy()
        return found

    order = np.lexsort(
        (column("kafka_offset"), column("kafka_partition"), column("ingest_time"), codes[repeated])
    )
    rows = repeated[order]
    ordered = codes[rows]
    later = rows[1:][ordered[1:] == ordered[:-1]]
    keep = np.ones(events.num_rows, dtype=bool)
    keep[later] = False
    return events.filter(pa.array(keep))


def _task(
    files: Sequence[str], interval: Interval, *, partial: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    start = pa.scalar(interval.start, pa.timestamp("us", tz="UTC"))
    end = pa.scalar(interval.end, pa.timestamp("us", tz="UTC"))

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for partition in batch.column("partition").to_pylist():
                pieces = [_partition_rows(file, partition) for file in files]
                rows = pa.concat_tables([p for p in pieces if p is not None])
                rows = rows.filter(
                    (pc.field("kafka_partition") == partition)
                    & (pc.field("event_time") >= start)
                    & (pc.field("event_time") < end)
                )
                rows = first_per_id(rows)
                yield from (ctr_arrow(rows) if partial else rows).to_batches(100_000)

    return task


def _partition_rows(file: str, partition: int) -> pa.Table | None:
    """The row groups of ``file`` whose statistics may hold ``partition``."""
    parquet = pq.ParquetFile(file)
    groups = [g for g, (low, high) in enumerate(_ranges(parquet)) if low <= partition <= high]
    return parquet.read_row_groups(groups, columns=READ) if groups else None


def _partitions(file: str) -> set[int]:
    """The Kafka partitions ``file``'s row groups may hold (their statistics: no data read)."""
    return {p for low, high in _ranges(pq.ParquetFile(file)) for p in range(low, high + 1)}


def _ranges(parquet: pq.ParquetFile) -> list[tuple[int, int]]:
    """Each row group's lowest and highest Kafka partition, from its statistics (the files
    the benchmark writes all have them)."""
    metadata = parquet.metadata
    column = metadata.schema.to_arrow_schema().get_field_index("kafka_partition")
    ranges = []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            raise ValueError(f"row group {group} has no kafka_partition bounds")
        ranges.append((int(stats.min), int(stats.max)))
    return ranges


def local_view(
    spark: SparkSession, files: Sequence[str], interval: Interval, *, partial: bool
) -> DataFrame:
    """The view of ``interval`` (counts only) over ``files``, deduplicated by Kafka partition."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = pq.read_schema(files[0])
    rows = pa.schema([schema.field(name) for name in READ])
    empty = pa.table({f.name: pa.array([], f.type) for f in rows})
    out = ctr_arrow(empty).schema if partial else rows
    partitions = sorted({p for file in files for p in _partitions(file)})
    tasks = spark.createDataFrame([(p,) for p in partitions], "partition int")
    tasks = tasks.repartition(len(partitions))
    found = tasks.mapInArrow(_task(files, interval, partial=partial), from_arrow_schema(out))
    if not partial:
        return found.transform(ctr)
    return found.groupBy("bucket_start", *DIMENSIONS).agg(
        F.sum("impressions").alias("impressions"), F.sum("clicks").alias("clicks")
    )


def parts(
    spark: SparkSession,
    files: Sequence[str],
    interval: Interval,
    scratch: Path,
    expected: tuple[int, int, int],
) -> dict[str, float]:
    """Seconds of the candidate's variants (each into Spark's ``noop`` sink, as the view's
    parts are), each checked to give ``expected`` (rows, impressions, clicks)."""
    from pyspark.sql import functions as F

    copy = sorted_copy(files, scratch / "sorted-by-kafka-partition")
    variants = {
        "the candidate over files sorted by Kafka partition: rows to Spark's view": (copy, False),
        "the same, the partial view counted in the tasks and summed by Spark": (copy, True),
        "the candidate over the table's own files (every row group decoded by each task)": (
            list(files),
            False,
        ),
    }
    seconds = {}
    for name, (chosen, partial) in variants.items():
        view = local_view(spark, chosen, interval, partial=partial)
        started = time.perf_counter()
        view.write.format("noop").mode("overwrite").save()
        seconds[name] = round(time.perf_counter() - started, 1)
        totals = view.agg(F.count("*"), F.sum("impressions"), F.sum("clicks")).first()
        if totals is None or tuple(totals) != expected:
            raise RuntimeError(f"{name}: {totals} where the job has {expected}")
    return seconds


def spark_reach(numbered: DataFrame) -> DataFrame:
    """The view with reach in Spark's own aggregates, as the job counted it before 2026-11-30
    (``collect_set`` of the numbers, ``hll_sketch_agg`` of the ids): the benchmark's "before"."""
    from pyspark.sql import functions as F

    kind, user, number = F.col("event_type"), F.col("user_id"), F.col("user_no")
    impression, click = kind == "impression", kind == "click"
    reach = (
        F.hll_sketch_agg(F.when(impression, user), sketches.LG_K),
        F.hll_sketch_agg(F.when(click, user), sketches.LG_K),
        F.array_sort(F.collect_set(F.when(impression, number))),
        F.array_sort(F.collect_set(F.when(click, number))),
    )
    return numbered.groupBy(F.date_trunc("minute", "event_time").alias("bucket_start"),
                            *DIMENSIONS).agg(
        F.count(F.when(impression, 1)).alias("impressions"),
        F.count(F.when(click, 1)).alias("clicks"),
        *(value.alias(name) for name, value in zip((*SKETCHES, *USER_NUMBERS), reach, strict=True)),
    )  # fmt: skip


def reach_parts(spark: SparkSession, lake: LakeSettings, interval: Interval) -> dict[str, float]:
    """Seconds of the view with reach in Spark's aggregates (before) and in Arrow tasks (the
    job's, :func:`views.ctr.with_reach`), and of the view without reach, back to back over the
    same deduplicated and numbered events
    (the job's dedup; the users numbered by the runs before), each into ``noop``; the Arrow
    rows are checked to equal Spark's (counts and number lists, and each sketch's estimate)."""
    from pyspark.sql import functions as F

    from batch_layer.job import deduplicate, interval_events
    from batch_layer.users import number_users
    from lake.catalog import MASTER_EVENTS
    from lake.storage import open_delta

    path = MASTER_EVENTS.path(lake)
    events, partitions, _ = interval_events(spark, path, open_delta(path, lake.object_store),
                                            interval)  # fmt: skip
    deduplicated = deduplicate(events, partitions)
    users = number_users(spark, lake, events.select("user_id")).users
    numbered = deduplicated.join(users, "user_id", "left")
    variants = {
        "the view without reach (the job's dedup)": deduplicated.transform(ctr),
        "the view with reach in Spark's aggregates (before)": spark_reach(numbered),
        "the view with reach counted in Arrow tasks (the job's)": ctr(
            numbered, reach=True, partitions=partitions
        ),
    }
    seconds = {}
    for name, view in variants.items():
        started = time.perf_counter()
        view.write.format("noop").mode("overwrite").save()
        seconds[name] = round(time.perf_counter() - started, 1)
    keys = ["bucket_start", *DIMENSIONS]
    estimate = F.udf(lambda b: None if b is None else sketches.sketch_estimate(b), "double")
    ours, theirs = (
        variants[name].select(
            *keys, "impressions", "clicks", *USER_NUMBERS, *(estimate(s).alias(s) for s in SKETCHES)
        )
        for name in list(variants)[1:]
    )
    differ = ours.exceptAll(theirs).limit(3).collect() + theirs.exceptAll(ours).limit(3).collect()
    if differ:
        raise RuntimeError(f"reach in Arrow tasks differs from Spark's: {differ}")
    return seconds
