"""Table snapshots as DuckDB relations: a Parquet scan of exactly one version's files."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import duckdb
import pyarrow as pa

from lake.catalog import BATCH_COVERAGE, SERVED
from lake.storage import duckdb_object_store
from runtime.object_store import ObjectStoreSettings
from serving_layer.snapshots import TableSnapshot
from views import sketches

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
    in-memory copy (``materialize``, for small tables read by every request). Rows as stored:
    speed/ctr's partial counts are summed by the queries that read them (or see
    :meth:`lake.catalog.Table.rows_sql`).

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


# DuckDB names: fixed prefixes plus a version number, never request text.
_PREFIX: Final = {t.name: t.sql_name for t in SERVED}
# speed/ctr is not copied: a new version every second (partial counts appended), and a copy
# of the whole table per version cost the API ~0.9 s of freshness (python -m bench speed).
_MATERIALIZED: Final = frozenset({BATCH_COVERAGE.name})
# A superseded relation stays this long for requests that pinned it before it was replaced,
# and this long after its last use (as-of requests read old versions).
_GRACE_S: Final = 120.0
_T = TypeVar("_T")


@dataclass
class Relation:
    name: str
    kind: str
    superseded_at: float | None = None
    used_at: float = 0.0
    derived: dict[str, object] = field(default_factory=dict)
    # Tables created from this version (covered intervals, stale arrivals), dropped with it.
    tables: list[str] = field(default_factory=list)


class RelationCache:
    """One in-memory DuckDB database holding a relation per (table, version) the requests use:
    a view over the version's Parquet files (``batch/ctr``: large, changes hourly; ``speed/ctr``:
    a new version every second, so a copy per version would cost more than it saves) and an
    in-memory copy of ``batch/coverage`` (small), plus values derived once per version.
    Relations of superseded versions are dropped a while later. Thread-safe."""

    def __init__(
        self,
        store: ObjectStoreSettings,
        *,
        threads: int = 2,
        memory_limit_bytes: int | None = None,
    ) -> None:
        config: dict[str, str | bool | int | float | list[str]] = {
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "threads": threads,
            # DuckDB keeps the bytes of every file it reads in memory until the memory limit
            # evicts them: with a new speed/ctr file every second, the API's memory grew by
            # hundreds of MB an hour (make soak). The lake's files are local (the OS page cache
            # holds the ones read again) and small per version.
            "enable_external_file_cache": False,
        }
        if memory_limit_bytes is not None:
            # Queries past it fail with DuckDB's out-of-memory error instead of growing the
            # process; nothing spills to disk.
            config["memory_limit"] = f"{max(memory_limit_bytes // 2**20, 16)}MB"
            config["temp_directory"] = ""
        self._db = duckdb.connect(config=config)
        self._db.execute("SET TimeZone = 'UTC'")
        if store.in_use:
            # The lake's files are s3:// URIs: this database (never the SQL sandbox's) reads
            # them with the store's secret.
            duckdb_object_store(self._db, store)
        self._db.execute("SET parquet_metadata_cache = true")
        sketches.register(self._db)  # sketch_union, sketch_estimate (lake.catalog.rows_sql)
        self._lock = threading.Lock()
        self._derive_lock = threading.RLock()  # a computation may derive another value
        self._relations: dict[tuple[str, int | None], Relation] = {}
        self._latest: dict[str, int | None] = {}

    def close(self) -> None:
        self._db.close()

    def create_table(self, name: str, data: pa.Table | str, *, owner: TableSnapshot) -> None:
        """Create the table ``name`` (a trusted identifier) from Arrow data or a SELECT over
        relations; it is dropped when ``owner``'s version is."""
        with self._lock, self.cursor() as cur:
            if isinstance(data, str):
                cur.execute(f"CREATE TABLE {name} AS {data}")
            else:
                create_arrow_table(cur, name, data)
            relation = self._relations.get((owner.name, owner.version))
            if relation is not None:
                relation.tables.append(name)

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        cur = self._db.cursor()
        try:
            yield cur
        finally:
            cur.close()

    def relation(self, table: TableSnapshot) -> Relation:
        key = (table.name, table.version)
        found = self._relations.get(key)
        if found is not None:
            found.used_at = time.monotonic()
            return found
        with self._lock:
            found = self._relations.get(key)
            if found is not None:
                found.used_at = time.monotonic()
                return found
            version = "missing" if table.version is None else f"v{table.version}"
            name = f"{_PREFIX[table.name]}_{version}"
            with self.cursor() as cur:
                kind = create_relation(cur, name, table, materialize=table.name in _MATERIALIZED)
            relation = Relation(name, kind, used_at=time.monotonic())
            self._relations[key] = relation
            self._retire(table.name, table.version)
            return relation

    def derived(self, table: TableSnapshot, what: str, compute: Callable[[str], _T]) -> _T:
        """A value computed once per table version (coverage intervals, row counts, …)."""
        relation = self.relation(table)
        if what not in relation.derived:
            # Once per version: concurrent first requests wait for one computation (some
            # computations create a named table, which a second attempt could not).
            with self._derive_lock:
                if what not in relation.derived:
                    relation.derived[what] = compute(relation.name)
        return cast(_T, relation.derived[what])

    def scalar(self, sql: str) -> Any:
        with self.cursor() as cur:
            row = cur.execute(sql).fetchone()
        return row[0] if row else None

    def _retire(self, table: str, version: int | None) -> None:
        """Mark older versions of ``table`` superseded; drop those superseded long enough."""
        now = time.monotonic()
        newest = self._latest.get(table)
        if version is not None and (newest is None or version > newest):
            self._latest[table] = version
        for (name, v), relation in list(self._relations.items()):
            if name != table or v == self._latest.get(table):
                continue
            if relation.superseded_at is None:
                relation.superseded_at = now
            elif now - max(relation.superseded_at, relation.used_at) > _GRACE_S:
                with self.cursor() as cur:
                    cur.execute(f"DROP {relation.kind} IF EXISTS {relation.name}")
                    for derived in relation.tables:
                        cur.execute(f"DROP TABLE IF EXISTS {derived}")
                del self._relations[(name, v)]
