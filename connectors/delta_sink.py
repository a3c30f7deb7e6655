"""A Delta Lake sink for Spark on the Python Data Source API, backed by delta-rs.

``df.write.format("ctr-delta")`` with the options delta-spark users know:

- ``path`` (or ``save(path)``): the table location;
- mode ``append`` or ``overwrite``; with ``replaceWhere`` an overwrite replaces only the rows
  matching the predicate (every written row must match it; rows outside are untouched), in one
  atomic commit;
- ``partitionBy``: comma-separated partition columns (the Python Data Source API does not carry
  ``DataFrameWriter.partitionBy``; ``connectors.formats.write_delta`` sets either form);
- ``txnAppId`` + ``txnVersion``: an idempotent write; if the table already holds a commit with
  that application id at that version or later, the write is a no-op (replayed micro-batches);
- ``userMetadata``: stored in the commit info.

Streaming (``writeStream.format("ctr-delta")``) commits each micro-batch idempotently under
(``txnAppId`` or the table path, batch id).

Tasks write Parquet files with statistics; the driver commits them in one transaction. The
predicate of ``replaceWhere`` is SQL evaluated by DuckDB on the files, so that path needs a
local (or mounted) table location.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from connectors.delta_files import DataFile, delete_files, write_files

log = logging.getLogger("ctr.connectors.delta")


class ReplaceWhereViolation(ValueError):
    """Rows written with replaceWhere that do not match its predicate."""


@dataclass(frozen=True)
class DeltaOptions:
    path: str
    partition_by: tuple[str, ...] = ()
    replace_where: str | None = None
    txn_app_id: str | None = None
    txn_version: int | None = None
    user_metadata: str | None = None

    @classmethod
    def parse(cls, options: dict[str, str]) -> DeltaOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise ValueError("the table path is required: .save(path) or .option('path', ...)")
        version = opts.get("txnversion")
        if (version is None) != (opts.get("txnappid") is None):
            raise ValueError("options 'txnAppId' and 'txnVersion' go together")
        if version is not None and not version.lstrip("-").isdigit():
            raise ValueError(f"option 'txnVersion' must be an integer, got {version!r}")
        return cls(
            path=path.removeprefix("file://"),
            partition_by=tuple(
                c.strip() for c in opts.get("partitionby", "").split(",") if c.strip()
            ),
            replace_where=opts.get("replacewhere") or None,
            txn_app_id=opts.get("txnappid"),
            txn_version=int(version) if version is not None else None,
            user_metadata=opts.get("usermetadata"),
        )


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    files: list[DataFile] = field(default_factory=list)


class DeltaDataSource(DataSource):
    """``df.write.format("ctr-delta")``: Delta tables through delta-rs."""

    @classmethod
    def name(cls) -> str:
        return "ctr-delta"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DeltaBatchWriter(_with_table_layout(dict(self.options)), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return DeltaStreamWriter(_with_table_layout(dict(self.options)), schema, overwrite)


def _with_table_layout(raw: dict[str, str]) -> DeltaOptions:
    """Options, with the partitioning of an existing table (tasks must lay files out by it)."""
    options = DeltaOptions.parse(raw)
    table = open_table(options.path)
    if table is None:
        return options
    existing = tuple(table.metadata().partition_columns)
    if options.partition_by and options.partition_by != existing:
        raise ValueError(
            f"{options.path} is partitioned by {list(existing)}, not {list(options.partition_by)}"
        )
    return dataclasses.replace(options, partition_by=existing)


def _write_task(options: DeltaOptions, batches: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return DeltaCommitMessage([])
    data = pa.concat_tables(tables)
    if options.replace_where:
        outside = count_outside(data, options.replace_where)
        if outside:
            raise ReplaceWhereViolation(
                f"replaceWhere: {outside} written row(s) do not match the predicate "
                f"{options.replace_where!r}; nothing was committed"
            )
    return DeltaCommitMessage(write_files(options.path, data, options.partition_by))


def count_outside(data: pa.Table, predicate: str) -> int:
    """Rows of ``data`` for which ``predicate`` is not true (false or null)."""
    import duckdb

    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("batch", data)
        row = con.execute(
            f"SELECT count(*) FROM batch WHERE NOT coalesce(({predicate}), false)"
        ).fetchone()
    return int(row[0]) if row else 0


class DeltaBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: DeltaOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.schema = schema
        self.overwrite = overwrite
        if options.replace_where and not overwrite:
            raise ValueError("replaceWhere needs mode('overwrite')")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return _write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = _files(messages)
        commit_files(
            self.options,
            to_arrow_schema(self.schema, timezone="UTC"),
            files,
            overwrite=self.overwrite,
            txn=_txn(self.options),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        delete_files(self.options.path, _files(messages))


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: DeltaOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.schema = schema
        self.overwrite = overwrite

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return _write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        app_id = self.options.txn_app_id or f"ctr-stream:{self.options.path}"
        commit_files(
            self.options,
            to_arrow_schema(self.schema, timezone="UTC"),
            _files(messages),
            overwrite=False,
            txn=(app_id, batchId),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        delete_files(self.options.path, _files(messages))


def _files(messages: list[WriterCommitMessage | None]) -> list[DataFile]:
    return [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]


def _txn(options: DeltaOptions) -> tuple[str, int] | None:
    if options.txn_app_id is None or options.txn_version is None:
        return None
    return options.txn_app_id, options.txn_version


def open_table(path: str) -> DeltaTable | None:
    return DeltaTable(path) if DeltaTable.is_deltatable(path) else None


def commit_files(
    options: DeltaOptions,
    schema: pa.Schema,
    files: list[DataFile],
    *,
    overwrite: bool,
    txn: tuple[str, int] | None,
) -> bool:
    """Commit written files in one transaction. False (and the files deleted) when ``txn``
    was already committed."""
    table = open_table(options.path)
    if txn is not None and table is not None:
        done = table.transaction_version(txn[0])
        if done is not None and done >= txn[1]:
            log.info("%s: %s version %d already committed; skipping", options.path, *txn)
            delete_files(options.path, files)
            return False
    properties = CommitProperties(
        app_transactions=[Transaction(txn[0], txn[1])] if txn else None,
        custom_metadata={"userMetadata": options.user_metadata} if options.user_metadata else None,
    )
    adds = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]
    if table is None:
        Path(options.path).mkdir(parents=True, exist_ok=True)
        create_table_with_add_actions(
            options.path,
            Schema.from_arrow(schema),
            adds,
            mode="error",
            partition_by=list(options.partition_by) or None,
            commit_properties=properties,
        )
        return True
    table_partitions = table.metadata().partition_columns
    if options.partition_by and list(options.partition_by) != table_partitions:
        delete_files(options.path, files)
        raise ValueError(
            f"{options.path} is partitioned by {table_partitions}, not {list(options.partition_by)}"
        )
    if overwrite and options.replace_where:
        removes, rewritten = _replace_where(table, options.path, options.replace_where)
        actions: list[AddAction | RemoveAction] = [*removes, *rewritten, *adds]
        table.create_write_transaction(
            actions, "append", Schema.from_arrow(schema), table_partitions,
            commit_properties=properties,
        )  # fmt: skip
    else:
        mode = "overwrite" if overwrite else "append"
        table.create_write_transaction(
            list(adds), mode, Schema.from_arrow(schema), table_partitions,
            commit_properties=properties,
        )  # fmt: skip
    return True


def _replace_where(
    table: DeltaTable, root: str, predicate: str
) -> tuple[list[RemoveAction], list[AddAction]]:
    """Remove actions for the files holding rows that match ``predicate``, plus the rewritten
    remainder of files that match only in part."""
    import duckdb

    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if not actions:
        return [], []
    partition_columns = table.metadata().partition_columns
    by_path = {a["path"]: a for a in actions}
    values_of = {
        path: {
            c: None if a.get(f"partition.{c}") is None else str(a[f"partition.{c}"])
            for c in partition_columns
        }
        for path, a in by_path.items()
    }
    schema = pa.schema(table.schema().to_arrow())
    removes: list[RemoveAction] = []
    adds: list[AddAction] = []
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        rows = con.execute(
            _scan_sql(root, list(values_of.items()), partition_columns, schema)
            + f" SELECT path, count(*) FILTER (WHERE coalesce(({predicate}), false)) AS hits, "
            "count(*) AS total FROM scan GROUP BY path HAVING hits > 0"
        ).fetchall()
        now = _now_ms()
        for path, hits, total in rows:
            action = by_path[path]
            removes.append(RemoveAction(path, True, now, action["size_bytes"], values_of[path]))
            if hits < total:
                keep = con.execute(
                    _scan_sql(root, [(path, values_of[path])], partition_columns, schema)
                    + f" SELECT * EXCLUDE (path) FROM scan WHERE NOT coalesce(({predicate}), false)"
                ).fetch_arrow_table()
                keep = keep.select(schema.names).cast(schema)
                for f in write_files(root, keep, partition_columns):
                    adds.append(
                        AddAction(
                            f.path, f.size, f.partition_values, f.modification_time, True, f.stats
                        )
                    )
    return removes, adds


def _scan_sql(
    root: str,
    files: list[tuple[str, dict[str, str | None]]],
    partition_columns: list[str],
    schema: pa.Schema,
) -> str:
    """A CTE ``scan`` over the given files, with their partition values and path as columns."""
    parts = []
    for path, values in files:
        columns = [f"{_quote(path)} AS path"]
        for column in partition_columns:
            value = values.get(column)
            cast = f"CAST({_quote(value)} AS {_duck_type(schema.field(column).type)})"
            columns.append(f'{"NULL" if value is None else cast} AS "{column}"')
        full = _quote(str(Path(root) / path))
        parts.append(
            f"SELECT *, {', '.join(columns)} FROM read_parquet({full}, hive_partitioning = false)"
        )
    return "WITH scan AS (" + " UNION ALL BY NAME ".join(parts) + ")"


def _quote(text: str | None) -> str:
    return "NULL" if text is None else "'" + text.replace("'", "''") + "'"


def _duck_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_date(arrow_type):
        return "DATE"
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMPTZ"
    if pa.types.is_integer(arrow_type):
        return "BIGINT"
    return "VARCHAR"


def _now_ms() -> int:
    return int(time.time() * 1000)
