"""DuckDB with the Delta extension, loaded from its PyPI package (no download at run time)."""

from __future__ import annotations

from pathlib import Path

import duckdb


def delta_duckdb() -> duckdb.DuckDBPyConnection:
    """A connection that can ``delta_scan`` tables, in UTC."""
    import duckdb_extension_delta

    package = Path(duckdb_extension_delta.__file__).parent
    [extension] = package.glob("extensions/*/delta.duckdb_extension")
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.execute(f"LOAD '{extension}'")
    con.execute("SET TimeZone = 'UTC'")
    return con
