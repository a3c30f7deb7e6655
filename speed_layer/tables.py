"""The speed layer's tables: ``speed/ctr`` (merged counts) and ``speed/late`` (what it dropped).

Both writes of a micro-batch are Delta commits carrying the application transaction
(speed query id, batch id), checked before writing: a micro-batch that Spark replays after a
crash changes nothing it already changed. ``speed/late`` is written first, so a committed
``speed/ctr`` transaction means the whole batch is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from views.ctr import DIMENSIONS

log = logging.getLogger("ctr.speed")

_TS = pa.timestamp("us", tz="UTC")
SPEED_CTR_SCHEMA: Final = pa.schema(
    [("bucket_start", _TS)]
    + [(d, pa.string()) for d in DIMENSIONS]
    + [("impressions", pa.int64()), ("clicks", pa.int64()), ("updated_at", _TS)]
)
LATE_SCHEMA: Final = pa.schema(
    [
        ("bucket_start", _TS),
        ("impressions", pa.int64()),
        ("clicks", pa.int64()),
        ("batch_id", pa.int64()),
        ("recorded_at", _TS),
    ]
)
KEY: Final = ("bucket_start", *DIMENSIONS)
_MERGE_PREDICATE: Final = " AND ".join(f"t.{column} = s.{column}" for column in KEY)
_COMMIT_ATTEMPTS: Final = 5

T = TypeVar("T")


def committed(path: str, app_id: str, batch_id: int) -> bool:
    """Whether the table at ``path`` already holds this (application, batch) transaction."""
    if not DeltaTable.is_deltatable(path):
        return False
    done = DeltaTable(path).transaction_version(app_id)
    return done is not None and done >= batch_id


def merge_counts(path: str, rows: pa.Table, app_id: str, batch_id: int) -> bool:
    """Add the batch's counts to ``speed/ctr`` (insert new buckets, add to existing ones).

    False when the transaction was already committed (a replayed batch) or there is nothing
    to add.
    """
    if rows.num_rows == 0:
        return False
    source = rows.select(SPEED_CTR_SCHEMA.names).cast(SPEED_CTR_SCHEMA)
    properties = CommitProperties(app_transactions=[Transaction(app_id, batch_id)])

    def attempt() -> bool:
        if committed(path, app_id, batch_id):
            return False
        if not DeltaTable.is_deltatable(path):
            write_deltalake(path, source, mode="error", commit_properties=properties)
            return True
        (
            DeltaTable(path)
            .merge(
                source,
                _MERGE_PREDICATE,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
            )
            .when_matched_update(
                {
                    "impressions": "t.impressions + s.impressions",
                    "clicks": "t.clicks + s.clicks",
                    "updated_at": "s.updated_at",
                }
            )
            .when_not_matched_insert_all()
            .execute()
        )
        return True

    return _retrying(path, attempt)


def append_late(path: str, rows: pa.Table, app_id: str, batch_id: int) -> bool:
    """Record the batch's dropped late events per bucket in ``speed/late``."""
    if rows.num_rows == 0:
        return False
    data = rows.select(LATE_SCHEMA.names).cast(LATE_SCHEMA)
    properties = CommitProperties(app_transactions=[Transaction(app_id, batch_id)])

    def attempt() -> bool:
        if committed(path, app_id, batch_id):
            return False
        write_deltalake(path, data, mode="append", commit_properties=properties)
        return True

    return _retrying(path, attempt)


def _retrying(path: str, attempt: Callable[[], T]) -> T:
    """Run a commit, retrying when a concurrent writer (the maintenance DAG) won the race."""
    for number in range(1, _COMMIT_ATTEMPTS + 1):
        try:
            return attempt()
        except CommitFailedError as exc:
            if number == _COMMIT_ATTEMPTS:
                raise
            log.warning("%s: concurrent commit (%s); retrying", path, exc)
            time.sleep(0.2 * number)
    raise AssertionError("unreachable")


def reset(path: str, schema: pa.Schema) -> None:
    """Empty a speed table (a new version; history and concurrent readers are unaffected)."""
    if DeltaTable.is_deltatable(path):
        write_deltalake(path, schema.empty_table(), mode="overwrite")
