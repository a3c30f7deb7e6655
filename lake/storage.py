"""Where the lake's bytes are: a local folder, or an S3-compatible object store.

``LAKE_ROOT=s3://bucket/prefix`` puts every table in a bucket; the store is named by the
standard AWS variables (:class:`runtime.object_store.ObjectStoreSettings`, read once at the
entry point with the lake's settings: ``LakeSettings.object_store``) and passed down to every
function that may touch it, which hands it to each client in its own dialect:

* delta-rs (every commit to the lake, and the jobs' reads): :func:`delta_options`;
* pyarrow (data files written in Spark tasks, the SQL sandbox's scans): :func:`arrow_filesystem`;
* Spark (``s3://`` read through Hadoop's S3A): :func:`runtime.object_store.spark_conf`;
* DuckDB (the API's scans, ``httpfs``): :func:`duckdb_secret_sql`.

Safe concurrent commits need the store's conditional writes (``If-None-Match: *``): delta-rs
creates each log entry with one, so of two writers of the same version one gets a conflict and
retries, as on a local disk. The server ``ctr s3 up`` starts supports them (see ``infra/s3.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from runtime.object_store import ObjectStoreSettings, is_object_store

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    import pyarrow.fs as pafs
    from deltalake import DeltaTable


def delta_options(location: str, store: ObjectStoreSettings) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for a table at ``location`` on ``store`` (None for a local
    path)."""
    if not is_object_store(location):
        return None
    return {
        **store.environment(),
        # Each log entry is created with If-None-Match: * (no lock service needed).
        "AWS_CONDITIONAL_PUT": "etag",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not store.uses_path_style).lower(),
        "AWS_ALLOW_HTTP": str(not store.secure).lower(),
    }


def to_delta_uri(location: str) -> str:
    """delta-rs and DuckDB know ``s3://``, not Hadoop's ``s3a://``."""
    return "s3://" + location[len("s3a://") :] if location.startswith("s3a://") else location


def store_path(location: str) -> str:
    """The path of ``location`` within its pyarrow filesystem (:func:`arrow_filesystem`)."""
    import os

    if is_object_store(location):
        parsed = urlparse(to_delta_uri(location))
        return f"{parsed.netloc}{parsed.path}".rstrip("/")
    if location.startswith("file://"):
        location = location[len("file://") :]
    return os.path.abspath(location)


def arrow_filesystem(location: str, store: ObjectStoreSettings) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path within it for ``location`` (a local path, a
    ``file://`` URI or an object-store URI on ``store``)."""
    import pyarrow.fs as pafs

    if not is_object_store(location):
        return pafs.LocalFileSystem(), store_path(location)
    return _s3_filesystem(store), store_path(location)


@cache
def _s3_filesystem(s3: ObjectStoreSettings) -> pafs.FileSystem:
    """One filesystem per store (settings compare by value)."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        access_key=s3.access_key_id,
        secret_key=s3.secret(),
        region=s3.region,
        endpoint_override=s3.endpoint_host,
        scheme="https" if s3.secure else "http",
        force_virtual_addressing=not s3.uses_path_style,
    )


def duckdb_object_store(con: duckdb.DuckDBPyConnection, store: ObjectStoreSettings) -> None:
    """Let ``con`` read the object store ``store``: DuckDB's httpfs, loaded from its PyPI
    package (no download at run time), and the store's secret."""
    from pathlib import Path

    import duckdb_extension_httpfs

    package = Path(duckdb_extension_httpfs.__file__).parent
    [extension] = package.glob("extensions/*/httpfs.duckdb_extension")
    con.execute(f"LOAD '{extension}'")
    con.execute(duckdb_secret_sql(store))


def duckdb_secret_sql(store: ObjectStoreSettings) -> str:
    """``CREATE SECRET`` for DuckDB's httpfs reading ``store`` (only ever run on the API's own
    connections: the SQL sandbox reads through Arrow and holds no secret)."""

    def literal(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    parts = [
        "TYPE s3",
        "PROVIDER config",
        f"REGION {literal(store.region)}",
        f"URL_STYLE {literal('path' if store.uses_path_style else 'vhost')}",
        f"USE_SSL {str(store.secure).lower()}",
    ]
    if store.endpoint_host:
        parts.append(f"ENDPOINT {literal(store.endpoint_host)}")
    if store.access_key_id:
        parts.append(f"KEY_ID {literal(store.access_key_id)}")
    secret = store.secret()
    if secret:
        parts.append(f"SECRET {literal(secret)}")
    return f"CREATE OR REPLACE SECRET ctr_lake ({', '.join(parts)})"


def open_delta(
    location: str, store: ObjectStoreSettings, *, version: int | None = None
) -> DeltaTable:
    """The delta-rs handle of the table at ``location`` (its latest version, or ``version``)."""
    from deltalake import DeltaTable

    return DeltaTable(location, version=version, storage_options=delta_options(location, store))


def ensure_properties(table: DeltaTable, wanted: Mapping[str, str]) -> None:
    """Set those of ``wanted``'s table properties that ``table`` lacks or holds otherwise."""
    current = table.metadata().configuration
    missing = {k: v for k, v in wanted.items() if current.get(k) != v}
    if missing:
        table.alter.set_table_properties(missing)


def ensure_columns(table: DeltaTable, schema: pa.Schema) -> list[str]:
    """Add the columns of ``schema`` that ``table`` lacks (a table created before they were
    added to the catalog), nullable: its older rows read null there. Returns their names."""
    from deltalake.schema import Field

    present = set(table.schema().to_arrow().names)
    missing = [f for f in schema if f.name not in present]
    if missing:
        table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in missing])
    return [f.name for f in missing]


def is_delta(location: str, store: ObjectStoreSettings) -> bool:
    """Whether a Delta table exists at ``location``."""
    from deltalake import DeltaTable

    options = delta_options(location, store)
    return bool(DeltaTable.is_deltatable(location, storage_options=options))
