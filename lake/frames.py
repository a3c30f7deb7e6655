"""Small results committed to the lake by delta-rs from the driver: a run's coverage row, the
drift of its minutes (one row each). The rows pass through the driver, so nothing that grows
with the events may come here: a batch view's rows are written by Spark's tasks and only their
files committed (:mod:`lake.view_files`), the archiver's likewise (:mod:`lake.data_files`).

Every commit to the lake goes through delta-rs, whichever job computed the rows: delta-rs
creates each log entry with a conditional write (``If-None-Match: *`` on an object store, an
atomic rename-if-absent on a local disk), so two processes committing to the same table never
overwrite each other's version: the later one gets a ``CommitFailedError`` (or resolves the
conflict itself, for appends) and the batch job reruns
(:func:`runtime.connectors.is_commit_conflict`). delta-spark, whose S3 log store is safe within
one JVM only, reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from lake.storage import delta_options, ensure_columns, is_delta, open_delta
from runtime.object_store import ObjectStoreSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def commit_frame(  # noqa: PLR0913 - keyword-only options of one commit
    frame: DataFrame | pa.Table,
    path: str,
    store: ObjectStoreSettings,
    schema: pa.Schema,
    *,
    predicate: str | None = None,
    txn: tuple[str, int] | None = None,
    properties: Mapping[str, str] | None = None,
    partition_by: Sequence[str] = (),
) -> bool:
    """Commit ``frame``'s rows (collected as Arrow, in ``schema``) to the table at ``path`` (on
    the lake's object store ``store`` when it is there) in one commit: appended, or, with a
    ``predicate`` (SQL), replacing exactly the rows it matches. ``txn`` = (application id,
    version) makes it idempotent: nothing is written when the table holds that version of the
    application already. ``properties`` and ``partition_by`` are the table's when this commit
    creates it. Returns whether it wrote."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    rows = frame if isinstance(frame, pa.Table) else frame.toArrow()
    rows = rows.select(schema.names).cast(schema)
    table = open_delta(path, store) if is_delta(path, store) else None
    if txn is not None and table is not None:
        done = table.transaction_version(txn[0])
        if done is not None and done >= txn[1]:
            return False
    commit = (
        CommitProperties(app_transactions=[Transaction(app_id=txn[0], version=txn[1])])
        if txn is not None
        else None
    )
    creating = table is None
    if table is not None:
        ensure_columns(table, schema)
    partitions = (list(partition_by) or None) if creating else None
    configuration = (dict(properties or {}) or None) if creating else None
    options = delta_options(path, store) if creating else None
    target = path if table is None else table
    if predicate is not None:
        write_deltalake(
            target, rows, mode="overwrite", predicate=predicate, partition_by=partitions,
            configuration=configuration, storage_options=options, commit_properties=commit,
        )  # fmt: skip
    else:
        write_deltalake(
            target, rows, mode="append", partition_by=partitions,
            configuration=configuration, storage_options=options, commit_properties=commit,
        )  # fmt: skip
    return True
