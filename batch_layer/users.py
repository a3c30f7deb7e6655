"""The user dictionary ``batch/users``: one dense number per user id, from 1, so that a minute
row lists its users as four-byte numbers (:data:`views.columns.USER_NUMBERS`) and a set of users
is a Roaring bitmap (:mod:`views.bitmaps`: the hour rows of :mod:`batch_layer.hours`).

Kept by the batch runs, the way Spark scales: a run numbers the users of its interval that the
dictionary has not got yet.

- Spark's tasks find them: the interval's distinct ids, anti-joined against the dictionary's
  files (read by the tasks; the driver lists them from the log it holds).
- The driver learns only how many each task found (one count per task), and gives each task
  its first number: the dictionary's largest (from its log's statistics: no file is opened),
  plus the new users of the tasks before it.
- The tasks number their users in the order of their ids and write the files; the driver
  commits their descriptions, on the dictionary's version it numbered from, with the
  application id :data:`APP_ID`. Two runs that both add users at once conflict on that id
  (delta-rs refuses the later commit), and the later one numbers again on top of the first.
  One user, one number: exact by construction, no hash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final, NamedTuple

import pyarrow as pa

from lake import view_files
from lake.catalog import BATCH_USERS
from lake.data_files import FILES_SCHEMA, DataFile, write_files
from lake.settings import LakeSettings
from runtime.connectors import is_commit_conflict
from runtime.object_store import ObjectStoreSettings

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

# The application id every commit of new users carries (see the module's docstring).
APP_ID: Final = "ctr-batch-users"
# Numberings a run tries before its conflict goes to the batch job (which reruns the run).
NUMBERING_ATTEMPTS: Final = 8
_PARTITION: Final = "_task"


class Dictionary(NamedTuple):
    """The dictionary after a run numbered its users: every (``user_id``, ``user_no``) as
    Spark's tasks read it, and how many users the run added."""

    users: DataFrame
    added: int


def number_users(
    spark: SparkSession,
    lake: LakeSettings,
    user_ids: DataFrame,
    *,
    on_step: Callable[[str], None] = lambda step: None,
) -> Dictionary:
    """Number the ids of ``user_ids`` (a ``user_id`` column; nulls and empty ids are not users)
    the dictionary has not got, commit them, and return the dictionary with them.

    A concurrent run that added users first makes the commit conflict: this numbering alone is
    done again on the newer dictionary (nothing else of the run depends on it yet), up to
    :data:`NUMBERING_ATTEMPTS` times, so parallel backfills do not rerun whole runs for it."""
    for attempt in range(1, NUMBERING_ATTEMPTS + 1):
        try:
            return _number_once(spark, lake, user_ids, on_step=on_step)
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == NUMBERING_ATTEMPTS:
                raise
            on_step("a concurrent run numbered users first; numbering again")
    raise AssertionError("unreachable")


def _number_once(
    spark: SparkSession,
    lake: LakeSettings,
    user_ids: DataFrame,
    *,
    on_step: Callable[[str], None],
) -> Dictionary:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    path = BATCH_USERS.path(lake)
    table = view_files.open_table(
        path, lake.object_store, BATCH_USERS.schema, properties=lake.retention(BATCH_USERS.name)
    )
    files, top = dictionary_files(table)
    known = view_files.read_files(spark, path, BATCH_USERS.schema, files)
    wanted = user_ids.select("user_id").where("user_id IS NOT NULL AND user_id != ''").distinct()
    new = wanted.join(known, "user_id", "left_anti").withColumn(_PARTITION, F.spark_partition_id())
    new = new.persist()
    try:
        counts = {
            int(r[_PARTITION]): int(r["count"])
            for r in new.groupBy(_PARTITION).count().collect()  # one row per task
        }
        added = sum(counts.values())
        if not added:
            return Dictionary(known, 0)
        on_step(f"numbering {added:,} new users from {top + 1:,}")
        task = functools.partial(
            write_numbered,
            offsets=task_offsets(counts, top),
            root=path,
            store=lake.object_store,
        )
        answers = (
            new.sortWithinPartitions("user_id")
            .mapInArrow(task, from_arrow_schema(FILES_SCHEMA))
            .toArrow()  # a short row per file
            .to_pylist()
        )
    finally:
        new.unpersist()
    written = [DataFile(**a) for a in answers]  # type: ignore[typeddict-item]
    commit(table, written, version=top + added)
    users = view_files.read_files(
        spark, path, BATCH_USERS.schema, [*files, *(f["path"] for f in written)]
    )
    return Dictionary(users, added)


def dictionary_files(table: DeltaTable) -> tuple[list[str], int]:
    """The dictionary's files at the version ``table`` was opened at, and its largest number
    (0: none), from its log's statistics."""
    import pyarrow.compute as pc

    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return [], 0
    top = pc.max(files.column("max.user_no")).as_py()
    return [str(p) for p in files.column("path").to_pylist()], int(top or 0)


def task_offsets(counts: Mapping[int, int], top: int) -> dict[int, int]:
    """Each task's first number less one: ``top`` (the dictionary's largest number) plus the
    new users of the tasks before it (``counts``: new users per task)."""
    offsets, start = {}, top
    for task in sorted(counts):
        offsets[task] = start
        start += counts[task]
    return offsets


def write_numbered(
    batches: Iterator[pa.RecordBatch],
    *,
    offsets: Mapping[int, int],
    root: str,
    store: ObjectStoreSettings,
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: one task's new users (sorted by id) numbered from its offset and
    written as a file of the dictionary; yields the file's description."""
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    rows = pa.concat_tables(tables)
    first = offsets[rows.column(_PARTITION)[0].as_py()] + 1
    numbered = pa.table(
        {
            "user_id": rows.column("user_id"),
            "user_no": pa.array(range(first, first + rows.num_rows), pa.int32()),
        }
    )
    files = write_files(BATCH_USERS.name, root, store, numbered, dictionary=())
    yield pa.RecordBatch.from_pylist([dict(f) for f in files], schema=FILES_SCHEMA)


def commit(table: DeltaTable, files: list[DataFile], *, version: int) -> None:
    """Commit ``files`` on ``table`` as it was opened with :data:`APP_ID` at ``version`` (the
    dictionary's new largest number)."""
    from deltalake import CommitProperties, Transaction

    from lake.append_table import add_action

    table.create_write_transaction(
        [add_action(f) for f in files],
        mode="append",
        schema=table.schema(),
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=APP_ID, version=version)]
        ),
    )
