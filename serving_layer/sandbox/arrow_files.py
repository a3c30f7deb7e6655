"""A snapshot's table as the sandbox reads it: its Parquet files as Arrow datasets, opened for
reading only. Files rewritten by delta-rs record Arrow's ``string_view`` and ``binary_view``
types, which Arrow's dataset scanner cannot filter: those (``view_files``, found from their
footers) are read with their own types and no filter pushed into Arrow."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from lake.catalog import SERVED_BY_NAME
from lake.storage import arrow_filesystem, store_path
from runtime.object_store import ObjectStoreSettings
from serving_layer.snapshots import TableSnapshot


def table_rows(
    con: duckdb.DuckDBPyConnection,
    table: TableSnapshot,
    view_files: Collection[str],
    store: ObjectStoreSettings,
) -> duckdb.DuckDBPyRelation:
    """The table's files as Arrow datasets (partition values from the paths, as Delta writes
    them), or an empty table of its schema; columns of the catalog's schema that the table
    lacks (written before they were added) are null. The files of ``view_files`` are read
    with Arrow's view types, behind a LIMIT that no filter is pushed through."""
    schema = table.schema
    for column in SERVED_BY_NAME[table.name].schema:
        if column.name not in schema.names:
            schema = schema.append(column)
    if not table.files:
        return con.from_arrow(schema.empty_table())
    plain = [f for f in table.files if f not in view_files]
    viewed = [f for f in table.files if f in view_files]
    parts = []
    if plain:
        parts.append(con.from_arrow(_dataset(table, plain, schema, store)))
    if viewed:
        typed = view_typed(schema, keep=table.partition_columns)
        # DuckDB pushes no filter through a LIMIT: Arrow only projects these files' columns.
        parts.append(con.from_arrow(_dataset(table, viewed, typed, store)).limit(_NO_LIMIT))
    # UNION ALL: the same columns in the same order.
    return parts[0] if len(parts) == 1 else parts[0].union(parts[1])


# More rows than any table holds: a LIMIT that limits nothing, a barrier to filter pushdown.
_NO_LIMIT: Final = 2**63 - 1
# The error a filter on a view-typed column gets from Arrow's scanner.
VIEW_TYPE_ERROR: Final = re.compile(r"has no kernel matching input types \([^)]*_view")


def _dataset(
    table: TableSnapshot, files: Sequence[str], schema: pa.Schema, store: ObjectStoreSettings
) -> ds.Dataset:
    filesystem, root = arrow_filesystem(table.path, store)
    partitioning = None
    if table.partition_columns:
        partitioning = ds.partitioning(
            pa.schema([table.schema.field(c) for c in table.partition_columns]), flavor="hive"
        )
    return ds.dataset(
        [store_path(f) for f in files],
        schema=schema,
        format="parquet",
        filesystem=filesystem,
        partitioning=partitioning,
        partition_base_dir=root,
    )


def view_typed_files(
    tables: Iterable[TableSnapshot], known: Mapping[str, bool], store: ObjectStoreSettings
) -> dict[str, bool]:
    """Whether each file of ``tables`` not in ``known`` records a view type (its footer, read
    with Arrow): the files :func:`open_sandbox` must read without filter pushdown."""
    found: dict[str, bool] = {}
    for table in tables:
        unknown = [f for f in table.files if f not in known and f not in found]
        if not unknown:
            continue
        filesystem, _ = arrow_filesystem(table.path, store)
        for path in unknown:
            physical = pq.read_schema(store_path(path), filesystem=filesystem)
            found[path] = any(_has_view(f.type) for f in physical)
    return found


def view_typed(schema: pa.Schema, *, keep: Sequence[str] = ()) -> pa.Schema:
    """``schema`` with its strings and binaries (nested ones too) as Arrow's view types, but for
    the columns in ``keep`` (partition values, typed from the paths)."""
    return pa.schema(
        [f if f.name in keep else f.with_type(_view_type(f.type)) for f in schema],
        metadata=schema.metadata,
    )


def _view_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.string_view()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.binary_view()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(_view_type(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_view_type(f.type)) for f in kind])
    return kind


def _has_view(kind: pa.DataType) -> bool:
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_view(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_view(f.type) for f in kind)
    return False
