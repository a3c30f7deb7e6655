"""A snapshot's table as the sandbox reads it: its Parquet files as one Arrow dataset in the
table's logical types, opened for reading only.

Each Parquet file records the Arrow type its writer had for a column: Spark none (a string is
``string``), delta-rs ``string_view`` and ``binary_view`` in the files its ``DELETE`` rewrites
(the platform's clean-ups of master/arrivals among them) and in appends of such data, other
writers ``large_string``, ``large_binary``, ``large_list``. Arrow's Parquet reader gives each
column the type its file records, and Arrow's compute has no kernels for the view types. Read in
the table's types, a filter on a string failed at such a file's statistics ("Function 'equal'
has no kernel matching input types (string, string_view)"); read in the file's own types, every
filter failed where the scanner drops rows ("'array_filter' has no kernel matching input types
(string_view, bool)"), those DuckDB pushes while a query runs too (a hash join's key range
or list, from the merged views' own joins), which no ``LIMIT`` stops.

So every file of a table is read one way, whatever its writer recorded: the reader decodes each
top-level string and binary column through a dictionary of plain ``string`` or ``binary`` (the
one decoding that does not follow the recorded type), and the scanner casts every column to the
table's logical types (:func:`logical_schema`; lists of view or large strings included) before
it evaluates a filter. DuckDB's filters push down into every file, and the files' statistics
still skip row groups by time and by number; a string or binary column's skip none (read as a
dictionary), and one of mostly distinct values decodes at about half the speed (few distinct
values, as the dimensions have: faster). Nothing is read ahead to learn a file's types: each
file's footer is read once per query, by the scan, on a local lake and on an object store alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from lake.catalog import SERVED_BY_NAME
from lake.storage import arrow_filesystem, store_path
from runtime.object_store import ObjectStoreSettings
from serving_layer.snapshots import TableSnapshot


def table_rows(
    con: duckdb.DuckDBPyConnection, table: TableSnapshot, store: ObjectStoreSettings
) -> duckdb.DuckDBPyRelation:
    """The table's files as one Arrow dataset in its :func:`logical_schema` (partition values
    from the paths, as Delta writes them), or an empty table of that schema."""
    schema = logical_schema(table)
    if not table.files:
        return con.from_arrow(schema.empty_table())
    return con.from_arrow(dataset(table, schema, store))


def logical_schema(table: TableSnapshot) -> pa.Schema:
    """The table's schema (its Delta log's), with the catalog's columns it lacks (written
    before they were added: null) appended, every string, binary and list in its plain type."""
    schema = table.schema
    for column in SERVED_BY_NAME[table.name].schema:
        if column.name not in schema.names:
            schema = schema.append(column)
    return pa.schema([f.with_type(_plain(f.type)) for f in schema], metadata=schema.metadata)


def dataset(table: TableSnapshot, schema: pa.Schema, store: ObjectStoreSettings) -> ds.Dataset:
    """The table's files read in ``schema`` (plain types), whatever types each file records."""
    filesystem, root = arrow_filesystem(table.path, store)
    partitioning = None
    if table.partition_columns:
        partitioning = ds.partitioning(
            pa.schema([schema.field(c) for c in table.partition_columns]), flavor="hive"
        )
    return ds.dataset(
        [store_path(f) for f in table.files],
        schema=schema,
        format=parquet_format(schema, keep=table.partition_columns),
        filesystem=filesystem,
        partitioning=partitioning,
        partition_base_dir=root,
    )


def parquet_format(schema: pa.Schema, *, keep: Sequence[str] = ()) -> ds.ParquetFileFormat:
    """Parquet read so that no column comes out in a view type: each top-level string and
    binary column of ``schema`` (but those in ``keep``: partition values, from the paths)
    decoded through a dictionary, which the scanner casts to the plain type."""
    decoded = [
        f.name
        for f in schema
        if f.name not in keep and (pa.types.is_string(f.type) or pa.types.is_binary(f.type))
    ]
    return ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=decoded))


def _plain(kind: pa.DataType) -> pa.DataType:
    """``kind`` with Arrow's view and large strings, binaries and lists as the plain ones."""
    if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind):
        return pa.binary()
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_list_view(kind)
        or pa.types.is_large_list_view(kind)
    ):
        return pa.list_(kind.value_field.with_type(_plain(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_plain(f.type)) for f in kind])
    return kind
