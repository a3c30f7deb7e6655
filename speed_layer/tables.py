"""The speed layer's tables: ``speed/ctr`` (merged counts) and ``speed/late`` (what it dropped),
written through delta-spark.

Both writes of a micro-batch are Delta commits carrying the application transaction
(speed query id, batch id), and delta-spark skips a write whose transaction the table already
holds: the append through the writer's ``txnAppId``/``txnVersion`` options, the MERGE through
the session confs ``spark.databricks.delta.write.txnAppId``/``txnVersion`` (Delta's idempotent
DML). A micro-batch that Spark replays after a crash changes nothing it already changed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final, TypeVar

from runtime.formats import write_delta
from views.columns import DIMENSIONS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("ctr.speed")

KEY: Final = ("bucket_start", *DIMENSIONS)
_MERGE_PREDICATE: Final = " AND ".join(f"t.{column} = s.{column}" for column in KEY)
_TXN_APP_ID: Final = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION: Final = "spark.databricks.delta.write.txnVersion"
_COMMIT_ATTEMPTS: Final = 5

T = TypeVar("T")


def exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def merge_counts(
    spark: SparkSession,
    path: str,
    rows: DataFrame,
    *,
    app_id: str,
    batch_id: int,
    buckets: tuple[dt.datetime, dt.datetime],
) -> None:
    """Add the batch's counts to ``speed/ctr``: insert new buckets, add to existing ones.
    A replay of (``app_id``, ``batch_id``) changes nothing.

    ``buckets`` are the first and last bucket of ``rows``: as literals in the MERGE condition
    they let Delta skip every file whose bucket range lies outside them (a micro-batch holds the
    last minute or two), so a MERGE rewrites the current minutes' files, not the table.
    """
    from delta.tables import DeltaTable

    source = rows.select(*KEY, "impressions", "clicks", "updated_at")
    first, last = (b.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00:00") for b in buckets)
    condition = (
        f"t.bucket_start >= timestamp'{first}' AND t.bucket_start <= timestamp'{last}' AND "
        + _MERGE_PREDICATE
    )

    def attempt() -> None:
        if not exists(spark, path):
            write_delta(source, path, txn=(app_id, batch_id))
            return
        with _transaction(spark, app_id, batch_id):
            (
                DeltaTable.forPath(spark, path)
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedUpdate(
                    set={
                        "impressions": "t.impressions + s.impressions",
                        "clicks": "t.clicks + s.clicks",
                        "updated_at": "s.updated_at",
                    }
                )
                .whenNotMatchedInsertAll()
                .execute()
            )

    _retrying(path, attempt)


def append_late(
    spark: SparkSession, path: str, rows: DataFrame, app_id: str, batch_id: int
) -> None:
    """Record the batch's dropped late events per bucket in ``speed/late`` (idempotent)."""
    _retrying(path, lambda: write_delta(rows, path, txn=(app_id, batch_id)))


@contextlib.contextmanager
def _transaction(spark: SparkSession, app_id: str, batch_id: int) -> Iterator[None]:
    """Delta's idempotent DML: the next DML of this session carries (app id, version)."""
    spark.conf.set(_TXN_APP_ID, app_id)
    spark.conf.set(_TXN_VERSION, str(batch_id))
    try:
        yield
    finally:
        spark.conf.unset(_TXN_APP_ID)
        spark.conf.unset(_TXN_VERSION)


def _retrying(path: str, attempt: Callable[[], T]) -> T:
    """Run a commit, retrying when a concurrent writer (maintenance) won the race."""
    from delta import exceptions as conflict

    conflicts = (
        conflict.DeltaConcurrentModificationException,
        conflict.ConcurrentWriteException,
        conflict.ConcurrentAppendException,
        conflict.ConcurrentDeleteReadException,
        conflict.ConcurrentDeleteDeleteException,
        conflict.ConcurrentTransactionException,
    )
    for number in range(1, _COMMIT_ATTEMPTS + 1):
        try:
            return attempt()
        except conflicts as exc:
            if number == _COMMIT_ATTEMPTS:
                raise
            log.warning("%s: concurrent commit (%s); retrying", path, str(exc).splitlines()[0])
            time.sleep(0.2 * number)
    raise AssertionError("unreachable")


def reset(spark: SparkSession, path: str, schema: StructType) -> None:
    """Empty a speed table (a new version; history and concurrent readers are unaffected)."""
    if exists(spark, path):
        spark.createDataFrame([], schema).write.format("delta").mode("overwrite").save(path)
