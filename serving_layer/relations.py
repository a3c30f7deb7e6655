"""Table snapshots as DuckDB relations: a Parquet scan of exactly one version's files."""

from __future__ import annotations

from typing import Final

import duckdb
import pyarrow as pa

from serving_layer.tables import TableSnapshot

_HIVE_TYPES: Final = {
    pa.date32(): "DATE",
    pa.string(): "VARCHAR",
    pa.large_string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
}


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def parquet_scan(table: TableSnapshot) -> str | None:
    """``read_parquet([...])`` over the snapshot's files; None for a table with no files.

    Partition values live in the file paths (``event_date=2026-11-21/…``), typed from the
    Delta schema.
    """
    if not table.files:
        return None
    files = ", ".join(quote_literal(f) for f in table.files)
    options = ["union_by_name = true"]
    if table.partition_columns:
        types = ", ".join(
            f"{quote_literal(c)}: {_HIVE_TYPES.get(table.schema.field(c).type, 'VARCHAR')}"
            for c in table.partition_columns
        )
        options += ["hive_partitioning = true", f"hive_types = {{{types}}}"]
    else:
        options.append("hive_partitioning = false")
    return f"read_parquet([{files}], {', '.join(options)})"


def create_relation(
    con: duckdb.DuckDBPyConnection, name: str, table: TableSnapshot, *, materialize: bool
) -> str:
    """Create ``name`` (a trusted identifier) over ``table``: a view over its files, or an
    in-memory copy (``materialize``, for small tables read by every request).

    Returns the kind created, ``TABLE`` or ``VIEW`` (a table with no files becomes an empty
    table of its schema).
    """
    scan = parquet_scan(table)
    if scan is None:
        create_arrow_table(con, name, table.schema.empty_table())
        return "TABLE"
    kind = "TABLE" if materialize else "VIEW"
    con.execute(f"CREATE {kind} {name} AS SELECT * FROM {scan}")
    return kind


def create_arrow_table(con: duckdb.DuckDBPyConnection, name: str, data: pa.Table) -> None:
    """Copy an Arrow table into the database as ``name`` (a trusted identifier)."""
    con.from_arrow(data).create(name)
