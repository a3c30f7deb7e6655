"""An interval of a batch view replaced the way Spark scales: the tasks write the data files,
the driver commits their descriptions.

A batch run replaces the rows of [start, end) in its view table (``batch/ctr``, ``batch/ctr_vN``).
The table is laid out so that no data file straddles an hour of ``bucket_start``
(:class:`lake.data_files.HourFiles`). A run:

1. reads the table's file list (its log, on the driver: metadata only) and picks the files whose
   ``bucket_start`` range (their statistics) meets the interval: those it replaces;
2. has its tasks write the interval's new rows and, from the files it replaces, the rows outside
   the interval (an interval that is not whole hours, or an older file that straddles hours:
   the first run over it rewrites it as hour files, which is how an existing lake migrates);
3. commits, in one delta-rs transaction, the removal of the replaced files and the new files,
   with application transactions: the run's id (a rerun of the same run commits nothing) and one
   per hour it touches. Two runs over the same hours always conflict, even over hours no file
   held yet (delta-rs refuses a commit whose application ids a concurrent commit wrote, or whose
   removed files a concurrent commit removed); the batch job then reruns
   (:func:`runtime.connectors.is_commit_conflict`). Files of a failed attempt are named by no
   commit; VACUUM deletes them after the table's retention.

The driver receives one short row per file written; no view row reaches it.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lake.data_files import FILES_SCHEMA, DataFile, HourFiles
from lake.storage import arrow_filesystem, delta_options, ensure_columns, is_delta, open_delta
from runtime.object_store import ObjectStoreSettings
from views.columns import DIMENSIONS

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession


COLUMN: Final = "bucket_start"
# A task's answer: a file written, and how many of its rows are the interval's.
ANSWER_SCHEMA: Final = pa.schema([*FILES_SCHEMA, ("interval_rows", pa.int64())])
_NEW: Final = "_interval_row"
# Tasks the rows are spread over at most.
MAX_WRITE_TASKS: Final = 1024
# Events (bytes of master/events files) one task writes the view of, in one hour, at most when
# there are cores to spare: a busier hour is split over several tasks (:func:`write_tasks`).
WRITE_INPUT_BYTES_PER_TASK: Final = 256 * 2**20


class Interval(Protocol):
    """[start, end) of whole minutes (``batch_layer.interval.Interval``)."""

    @property
    def start(self) -> dt.datetime: ...

    @property
    def end(self) -> dt.datetime: ...

    def sql_predicate(self, column: str) -> str: ...


@dataclass(frozen=True)
class ReplacedFile:
    """A committed file of the table a run replaces (from the log)."""

    path: str  # relative to the table's root
    size: int
    partition_values: Mapping[str, str | None]
    low: dt.datetime | None  # its bucket_start range; None: no statistics
    high: dt.datetime | None


@dataclass(frozen=True)
class Replaced:
    """What a run's commit did to the table."""

    committed: bool  # False: the table held this run's commit already
    rows: int  # the interval's rows written
    files_added: int
    files_removed: int
    rows_carried: int  # rows outside the interval rewritten from replaced files
    files: tuple[str, ...] = ()  # the files added (relative paths)


def open_table(
    path: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
    *,
    properties: Mapping[str, str] | None = None,
) -> DeltaTable:
    """The table at ``path`` (on the lake's object store ``store`` when it is there), created
    empty (with ``properties``) if it does not exist, its
    columns extended to ``schema``. The handle's version is what the commit is checked against:
    keep it until :func:`commit` (no refresh in between)."""
    from deltalake import DeltaTable

    if not is_delta(path, store):
        DeltaTable.create(
            path,
            schema,
            mode="ignore",  # a concurrent run created it first: the same table
            configuration=dict(properties or {}) or None,
            storage_options=delta_options(path, store),
        )
    table = open_delta(path, store)
    if ensure_columns(table, schema):
        table = open_delta(path, store)
    return table


def replaced_files(table: DeltaTable, interval: Interval) -> list[ReplacedFile]:
    """The table's files holding rows of ``interval``, by their ``bucket_start`` statistics (a
    file without them is taken: it may)."""
    last = interval.end - dt.timedelta(microseconds=1)
    return files_between(table, [(interval.start, last)])


def files_between(
    table: DeltaTable, spans: Sequence[tuple[dt.datetime, dt.datetime]]
) -> list[ReplacedFile]:
    """The table's files that may hold a ``bucket_start`` in one of the [first, last]
    ``spans``, by their statistics (the log's: no data file opened; a file without them is
    taken). The selection is columnar: only the files chosen become Python objects."""
    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows or not spans:
        return []
    low = _column(files, f"min.{COLUMN}")
    high = _column(files, f"max.{COLUMN}")
    kind = pa.timestamp("us", tz="UTC")
    chosen_mask = pc.or_(pc.is_null(low), pc.is_null(high))
    for first, last in spans:
        meets = pc.and_(
            pc.less_equal(low, pa.scalar(last, kind)),
            pc.greater_equal(high, pa.scalar(first, kind)),
        )
        chosen_mask = pc.or_(chosen_mask, meets)
    return _described(files.filter(chosen_mask))


def _described(chosen: pa.Table) -> list[ReplacedFile]:
    """Rows of the log's file list (``get_add_actions(flatten=True)``) as :class:`ReplacedFile`."""
    partitions = [n for n in chosen.column_names if n.startswith("partition.")]
    out = []
    for row, lo, hi in zip(
        chosen.select(["path", "size_bytes", *partitions]).to_pylist(),
        _column(chosen, f"min.{COLUMN}").to_pylist(),
        _column(chosen, f"max.{COLUMN}").to_pylist(),
        strict=True,
    ):
        values = {n.removeprefix("partition."): row[n] for n in partitions}
        out.append(ReplacedFile(row["path"], int(row["size_bytes"]), values, lo, hi))
    return out


def _column(files: pa.Table, name: str) -> pa.ChunkedArray:
    kind = pa.timestamp("us", tz="UTC")
    if name not in files.column_names:
        return pa.chunked_array([pa.nulls(files.num_rows, kind)])
    column = files.column(name)
    if pa.types.is_timestamp(column.type):
        return column.cast(kind)
    return pa.chunked_array([pa.nulls(files.num_rows, kind)])


def write(  # noqa: PLR0913 - keyword-only options of one write
    spark: SparkSession,
    view: DataFrame,
    *,
    name: str,
    path: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
    interval: Interval,
    replaced: Sequence[ReplacedFile],
    input_bytes: int = 0,
) -> list[dict[str, object]]:
    """Spark tasks write ``view`` (the interval's rows, in ``schema``'s columns) and the rows of
    the ``replaced`` files outside the interval as hour files under ``path`` (on ``store``, in
    the tasks' closure); the answer, one
    row per file (:data:`ANSWER_SCHEMA`), is all that returns to the driver. ``input_bytes``:
    the size of the events the view is computed from (how many tasks an hour needs)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    # A column the view leaves out (reach, in the benchmark's run without it) is null in every
    # row it writes: the tasks add it (a null column crossing from the JVM to Python costs
    # more than computing the view: 18 s for a day's 1.9M rows; python -m bench batch).
    rows = view.select(*(n for n in schema.names if n in view.columns), F.lit(True).alias(_NEW))
    carried = [f.path for f in replaced if _reaches_outside(f, interval)]
    if carried:
        kept = (
            read_files(spark, path, schema, carried)
            .where(f"NOT ({interval.sql_predicate(COLUMN)})")
            .select(*schema.names, F.lit(False).alias(_NEW))
        )
        rows = rows.unionByName(kept, allowMissingColumns=True)
    # Each hour's rows to one task, the hours over as many tasks as run at once: more tasks
    # than cores only add each task's start and its answer (24 tasks for a day cost a 2-core
    # machine 5 s, and 135 KiB of task results to the driver: python -m bench scale). An hour
    # larger than one task should write (a run over one busy hour on a cluster) is split over
    # several by its rows' dimensions: each task still writes files of that hour only.
    hours = _hours(interval, replaced)
    tasks, per_hour = write_tasks(hours, input_bytes, spark.sparkContext.defaultParallelism)
    keys = [F.date_trunc("hour", COLUMN)]
    if per_hour > 1:
        # More keys than tasks: Spark hashes the keys to tasks, and as many keys as tasks
        # would often leave a task without one (two keys hashed to the same task).
        split = F.hash(*(c for c in DIMENSIONS if c in view.columns))
        keys.append(F.pmod(split, F.lit(per_hour * 16)))
    spread = rows.repartition(tasks, *keys)
    # Sorted by minute in each task: one file open at a time (HourFiles buffers a row group
    # per open file), and row groups readers skip by minute.
    spread = spread.sortWithinPartitions(COLUMN)
    task = functools.partial(write_task, name=name, root=path, store=store, schema=schema)
    answers = spread.mapInArrow(task, from_arrow_schema(ANSWER_SCHEMA))
    answer: list[dict[str, object]] = answers.toArrow().to_pylist()  # a short row per file
    return answer


def write_tasks(hours: int, input_bytes: int, parallelism: int) -> tuple[int, int]:
    """(tasks, tasks per hour) writing ``hours`` hours of a view computed from ``input_bytes``
    of events with ``parallelism`` cores: an hour per task, the hours over at most as many
    tasks as cores; an hour of more than :data:`WRITE_INPUT_BYTES_PER_TASK` over several
    tasks, as far as the cores go round."""
    if hours < 1 or input_bytes < 0 or parallelism < 1:
        raise ValueError(f"hours, input_bytes, parallelism: {hours}, {input_bytes}, {parallelism}")
    needed = -(-input_bytes // (hours * WRITE_INPUT_BYTES_PER_TASK))
    per_hour = max(1, min(needed, parallelism // hours))
    return max(1, min(hours * per_hour, parallelism, MAX_WRITE_TASKS)), per_hour


def _reaches_outside(file: ReplacedFile, interval: Interval) -> bool:
    """Whether ``file`` may hold rows outside ``interval`` (rows its replacement carries over);
    a file wholly inside it is not read at all."""
    if file.low is None or file.high is None:
        return True
    return file.low < interval.start or file.high >= interval.end


def read_files(
    spark: SparkSession, path: str, schema: pa.Schema, files: Sequence[str]
) -> DataFrame:
    """The rows of ``files`` (relative to the table's root at ``path``, as its log names them)
    in ``schema`` (columns a file lacks are null; a partition column's value from the file's
    folder): Spark's tasks read them, and no Delta snapshot is rebuilt for it (delta-spark
    would, in a Spark job of its own)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark_schema = from_arrow_schema(schema)
    if not files:
        return spark.createDataFrame([], spark_schema)
    root = path.rstrip("/")
    reader = spark.read.schema(spark_schema).option("basePath", root)
    return reader.parquet(*(f"{root}/{unquote(f)}" for f in files))


def _hours(interval: Interval, replaced: Sequence[ReplacedFile]) -> int:
    """Hours the rows written can fall in: the interval's and the replaced files'."""
    lows = [interval.start, *(f.low for f in replaced if f.low is not None)]
    highs = [interval.end, *(f.high for f in replaced if f.high is not None)]
    first = _hour(min(lows))
    return max(1, -(-int((max(highs) - first).total_seconds()) // 3600))


def write_task(
    batches: Iterator[pa.RecordBatch],
    *,
    name: str,
    root: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: one task's rows written as hour files (:class:`HourFiles`); yields
    a row per file (:data:`ANSWER_SCHEMA`)."""
    files = HourFiles(name, root, store, schema, COLUMN)
    for batch in batches:
        rows = pa.Table.from_batches([batch])
        new = rows.column(_NEW)
        rows = _conform(rows.drop_columns([_NEW]), schema)
        files.write(rows.filter(new), counted=True)
        files.write(rows.filter(pc.invert(new)))
    written = files.close()
    if not written:
        return
    answer = [{**f, "interval_rows": files.counted[f["path"]]} for f in written]
    yield pa.RecordBatch.from_pylist(answer, schema=ANSWER_SCHEMA)


def hour_ids(interval: Interval) -> list[str]:
    """The application ids of the hours ``interval`` touches (see the module's docstring)."""
    first = _hour(interval.start)
    last = _hour(interval.end - dt.timedelta(microseconds=1))
    count = int((last - first).total_seconds() // 3600) + 1
    return [f"ctr-batch-hour:{first + dt.timedelta(hours=n):%Y%m%dT%H}" for n in range(count)]


def commit(
    table: DeltaTable,
    files: Sequence[DataFile],
    replaced: Sequence[ReplacedFile],
    *,
    interval: Interval,
    run_id: str,
    input_version: int,
) -> None:
    """Commit, on ``table`` as it was opened (:func:`open_table`), the removal of ``replaced``
    and the addition of ``files`` (written under its root) as one transaction carrying the run's
    application id and the interval's hours' (:func:`hour_ids`). Raises delta-rs'
    ``CommitFailedError`` when a concurrent commit replaced any of those hours first."""
    from deltalake import CommitProperties, Transaction
    from deltalake.transaction import AddAction, RemoveAction

    from lake.append_table import add_action

    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(f.path, True, now, f.size, dict(f.partition_values)) for f in replaced
    ]
    actions += [add_action(f) for f in files]
    # With their time: they expire after the table's history window (lake.retention).
    ids = [Transaction(app_id=run_id, version=input_version, last_updated=now)]
    ids += [
        Transaction(app_id=hour, version=input_version, last_updated=now)
        for hour in hour_ids(interval)
    ]
    table.create_write_transaction(
        actions,
        mode="append",
        schema=table.schema(),
        partition_by=table.metadata().partition_columns or None,
        commit_properties=CommitProperties(app_transactions=ids),
    )


def replace_interval(  # noqa: PLR0913 - keyword-only options of one replacement
    spark: SparkSession,
    view: DataFrame,
    *,
    name: str,
    path: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
    interval: Interval,
    run_id: str,
    input_version: int,
    properties: Mapping[str, str] | None = None,
    input_bytes: int = 0,
) -> Replaced:
    """Replace the rows of ``interval`` in the table ``name`` at ``path`` (on ``store``) with
    ``view``'s: the tasks write, the driver commits (see the module's docstring). Nothing is
    written when the table holds ``run_id``'s commit already."""
    table = open_table(path, store, schema, properties=properties)
    if table.transaction_version(run_id) is not None:
        return Replaced(False, 0, 0, 0, 0)
    replaced = replaced_files(table, interval)
    answers = write(
        spark, view, name=name, path=path, store=store, schema=schema, interval=interval,
        replaced=replaced, input_bytes=input_bytes,
    )  # fmt: skip
    files = [DataFile(**{k: a[k] for k in DataFile.__annotations__}) for a in answers]  # type: ignore[typeddict-item]
    commit(table, files, replaced, interval=interval, run_id=run_id, input_version=input_version)
    rows = sum(int(a["interval_rows"]) for a in answers)  # type: ignore[call-overload]
    total = sum(json.loads(str(a["stats"]))["numRecords"] for a in answers)
    paths = tuple(f["path"] for f in files)
    return Replaced(True, rows, len(files), len(replaced), total - rows, paths)


# A file under this size shares its hour with others in one file at compaction.
SMALL_FILE_BYTES: Final = 64 * 2**20
# Hours one compaction pass rewrites at most (a bounded slice; the next pass goes on).
COMPACT_HOURS_PER_PASS: Final = 48


@dataclass(frozen=True)
class Compacted:
    files_removed: int
    files_added: int
    hours_left: int  # hours still to compact, for the next pass


def compact_hours(
    path: str,
    store: ObjectStoreSettings,
    *,
    hours_per_pass: int = COMPACT_HOURS_PER_PASS,
    table: DeltaTable | None = None,
) -> Compacted:
    """Compaction of a batch view table that keeps its hour layout: the small files of an hour
    rewritten as one, and a file of an older layout (straddling hours, or without statistics)
    split into hour files, at most ``hours_per_pass`` hours (oldest first) in one commit that
    changes no data (``dataChange=false``). A batch run replaces an hour's files wholesale, so an
    hour rarely has more than one: the pass reads the log and little else. A run committing over
    the same files first makes this commit fail (the next pass retries)."""
    from deltalake import CommitProperties
    from deltalake.transaction import RemoveAction

    from lake.append_table import add_action

    table = table if table is not None else open_delta(path, store)
    schema = pa.schema(table.schema().to_arrow())
    if COLUMN not in schema.names:  # not a view table: no hour to lay it out by
        return Compacted(0, 0, 0)
    groups = _compactable(pa.table(table.get_add_actions(flatten=True)))
    chosen = sorted(groups)[:hours_per_pass]
    if not chosen:
        return Compacted(0, 0, 0)
    files = HourFiles("compaction", path, store, schema, COLUMN)
    filesystem, base = arrow_filesystem(path, store)
    removed = [f for key in chosen for f in groups[key]]
    for old in removed:
        parquet = pq.ParquetFile(f"{base.rstrip('/')}/{old.path}", filesystem=filesystem)
        for batch in parquet.iter_batches():
            files.write(_conform(pa.Table.from_batches([batch]), schema))
    now = int(time.time() * 1000)
    actions: list[object] = [
        RemoveAction(f.path, False, now, f.size, dict(f.partition_values)) for f in removed
    ]
    actions += [add_action(f, data_change=False) for f in files.close()]
    table.create_write_transaction(
        actions,  # type: ignore[arg-type]
        mode="append",
        schema=table.schema(),
        commit_properties=CommitProperties(),
    )
    return Compacted(len(removed), len(actions) - len(removed), len(groups) - len(chosen))


def _compactable(files: pa.Table) -> dict[tuple[dt.datetime, str], list[ReplacedFile]]:
    """The files a compaction rewrites (of the log's file list), by hour: every small file of
    an hour holding more than one, and each file that straddles hours (or whose range is
    unknown) alone. Chosen column by column: only those files become Python objects."""
    if not files.num_rows:
        return {}
    low = _column(files, f"min.{COLUMN}")
    high = _column(files, f"max.{COLUMN}")
    low_hour = pc.floor_temporal(low, unit="hour")
    odd = pc.fill_null(pc.not_equal(low_hour, pc.floor_temporal(high, unit="hour")), True)
    small = pc.and_(pc.invert(odd), pc.less(files.column("size_bytes"), SMALL_FILE_BYTES))
    hours = pa.table({"hour": low_hour, "small": small}).filter(small)
    counts = hours.group_by("hour").aggregate([("small", "count")])
    shared = counts.filter(pc.greater(counts.column("small_count"), 1)).column("hour")
    chosen = pc.or_(odd, pc.and_(small, pc.is_in(low_hour, value_set=shared.combine_chunks())))
    groups: dict[tuple[dt.datetime, str], list[ReplacedFile]] = {}
    for f in _described(files.filter(chosen)):
        if f.low is None or f.high is None or _hour(f.low) != _hour(f.high):
            low_at = f.low or dt.datetime.min.replace(tzinfo=dt.UTC)
            groups[(_hour(low_at), f.path)] = [f]
        else:
            groups.setdefault((_hour(f.low), ""), []).append(f)
    return groups


def _hour(moment: dt.datetime) -> dt.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` of a file in the table's current ``schema``: columns added since it was written
    are null."""
    for field in schema:
        if field.name not in rows.column_names:
            rows = rows.append_column(field.name, pa.nulls(rows.num_rows, field.type))
    return rows.select(schema.names).cast(schema)
