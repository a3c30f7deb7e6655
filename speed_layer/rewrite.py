"""The speed table's rewrites (roll-ups, minute and hour compaction) as Spark tasks: each task
reads one group of files, sums their rows per key and writes one file; only the new files'
descriptions come back, and the table's one writer (the speed job's driver) commits the swap
(:meth:`speed_layer.tables.SpeedTable.rewrite_groups`).

A group is the files of a minute or an hour of closed buckets: at a billion events a day a
minute is a file per task and micro-batch (thousands), more than a driver should read.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.dataset as ds

from lake.data_files import FILES_SCHEMA, DataFile, write_files
from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What a rewrite task returns: a row per file written, with its group and the rows it read and
# wrote.
REWRITE_SCHEMA: Final = pa.schema(
    [*FILES_SCHEMA, ("group", pa.int64()), ("rows_in", pa.int64()), ("rows_out", pa.int64())]
)
# Rows summed per key (speed_layer.tables.sum_per_key), then cast to the table's schema.
Summer = Callable[[pa.Table], pa.Table]


@dataclass
class Rewritten:
    """One group rewritten: its new files, and the rows it read and wrote."""

    files: list[DataFile]
    rows_in: int
    rows_out: int


# (table root, its object store, groups of file paths relative to the root, the table's schema,
# the summing) -> a Rewritten per group, in order.
Rewrite = Callable[
    [str, ObjectStoreSettings, Sequence[Sequence[str]], pa.Schema, Summer], list[Rewritten]
]


def spark_rewrite(spark: SparkSession) -> Rewrite:
    """Rewrites run as one Spark job, the groups spread over half the cores (a task per group
    at most): the job runs beside the stream's micro-batches (the speed job's maintenance
    thread), and with no more tasks than that, a core is free for each micro-batch's tasks
    whenever one starts (Spark's FIFO scheduling gives a freed core to the older job's tasks
    still waiting)."""

    def rewrite(
        root: str,
        store: ObjectStoreSettings,
        groups: Sequence[Sequence[str]],
        schema: pa.Schema,
        summed: Summer,
    ) -> list[Rewritten]:
        from pyspark.sql.pandas.types import from_arrow_schema

        if not groups:
            return []
        rows = [(n, json.dumps(list(paths))) for n, paths in enumerate(groups)]
        tasks = min(len(groups), max(1, spark.sparkContext.defaultParallelism // 2))
        frame = spark.createDataFrame(rows, "group long, paths string").repartition(tasks)
        task = functools.partial(
            rewrite_groups, root=root, store=store, schema=schema, summed=summed
        )
        answers = frame.mapInArrow(task, from_arrow_schema(REWRITE_SCHEMA)).toArrow()
        done = [Rewritten([], 0, 0) for _ in groups]
        for row in answers.to_pylist():
            group = done[row.pop("group")]
            group.rows_in += row.pop("rows_in")
            group.rows_out += row.pop("rows_out")
            group.files.append(DataFile(**row))  # type: ignore[typeddict-item]
        return done

    return rewrite


def rewrite_groups(
    batches: Iterator[pa.RecordBatch],
    *,
    root: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
    summed: Summer,
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: each group's files (``paths``, JSON) read (columns the table's
    ``schema`` gained since a file was written read null), summed per key and written as one
    file under ``root`` (on ``store``, from the task's closure). Yields :data:`REWRITE_SCHEMA`
    rows."""
    filesystem, base = arrow_filesystem(root, store)
    for batch in batches:
        for group, paths in zip(
            batch.column("group").to_pylist(), batch.column("paths").to_pylist(), strict=True
        ):
            names = [f"{base.rstrip('/')}/{p}" for p in json.loads(paths)]
            rows = ds.dataset(names, schema=schema, format="parquet", filesystem=filesystem)
            read = rows.to_table()
            out = summed(read).select(schema.names).cast(schema)
            files = write_files("speed", root, store, out)
            answer = [{**f, "group": group, "rows_in": 0, "rows_out": 0} for f in files]
            if answer:
                answer[0] |= {"rows_in": read.num_rows, "rows_out": out.num_rows}
            yield pa.RecordBatch.from_pylist(answer, schema=REWRITE_SCHEMA)
