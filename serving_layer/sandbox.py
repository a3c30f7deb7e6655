"""The SQL sandbox's database: which statements may run, and a DuckDB that cannot write.

Read-only by construction, in two independent layers:

1. **The statement.** DuckDB's own parser decides: exactly one statement, of type SELECT, that
   ``json_serialize_sql`` (which serializes queries and nothing else) accepts, starting with a
   query keyword; or ``EXPLAIN`` followed directly by such a query (never ``EXPLAIN ANALYZE``,
   which runs the statement). Comments are skipped by DuckDB's tokenizer, so nested comments
   mean what DuckDB thinks they mean.
2. **The database.** A fresh in-memory DuckDB with external access off from its first moment and
   no allowed paths: it cannot open, create or write any file. The lake's tables reach it as
   Arrow datasets over one snapshot's Parquet files, which Arrow opens for reading only.
   Python replacement scans are off and the configuration is locked.

The worker processes that run these databases add OS limits (see :mod:`serving_layer.sql_pool`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import duckdb
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from lake.catalog import SERVED, batch_table
from lake.coverage import Coverage
from lake.registry import Registry
from lake.staleness import stale_sql
from serving_layer.json_values import jsonable
from serving_layer.query import merged_sql
from serving_layer.tables import TableSnapshot
from views.definitions import versions

SANDBOX_VIEWS: Final[Mapping[str, str]] = {t.sql_name: t.name for t in SERVED}
VERSION_VIEWS: Final = tuple(
    f"{name}_v{d.version}"
    for d in versions("ctr")
    for name in ("covered", "stale", "ctr", "speed", "arrivals")
)
VIEW_NAMES: Final = (*SANDBOX_VIEWS, "covered", "stale", "ctr", *VERSION_VIEWS)
_QUERY_KEYWORDS: Final = frozenset(
    {"SELECT", "WITH", "FROM", "VALUES", "TABLE", "DESCRIBE", "SHOW", "SUMMARIZE", "("}
)
_FIRST_WORD: Final = re.compile(r"\(|[A-Za-z_]+")
_ALLOWED: Final = (
    "the SQL endpoint is read-only and accepts one query (SELECT, WITH, FROM, VALUES, TABLE, "
    "DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of a query) over the views " + ", ".join(VIEW_NAMES)
)

TruncatedBy = Literal["max_rows", "max_bytes"]


class SqlRefusedError(ValueError):
    """The statement is not a single read-only query."""


class SqlError(RuntimeError):
    """The query failed: a syntax error, an unknown table, a denied file, a resource limit, …"""


@dataclass(frozen=True)
class SqlResult:
    """A query's answer; ``rows`` hold JSON-ready values (:func:`jsonable`)."""

    columns: list[str]
    types: list[str]
    rows: list[list[object]]
    truncated_by: TruncatedBy | None
    elapsed_s: float

    @property
    def truncated(self) -> bool:
        return self.truncated_by is not None


def check_read_only(sql: str) -> str:
    """The statement to run for ``sql``, or :class:`SqlRefusedError` saying why not.

    Raises :class:`SqlError` when DuckDB cannot parse it.
    """
    if not sql.strip():
        raise SqlRefusedError("the query is empty")
    parser = duckdb.connect(config={"enable_external_access": False})
    try:
        statements = _statements(parser, sql)
        if len(statements) != 1:
            raise SqlRefusedError(f"one statement per query, got {len(statements)}")
        tokens = duckdb.tokenize(sql)
        if statements[0].type == duckdb.StatementType.EXPLAIN and len(tokens) > 1:
            option = _word(sql, tokens, 1)
            if option in ("ANALYZE", "ANALYSE", "("):
                raise SqlRefusedError(
                    "EXPLAIN ANALYZE (and EXPLAIN with options) is not allowed: it runs the "
                    "statement; EXPLAIN <query> shows the plan"
                )
            inner = sql[tokens[1][0] :]
            _require_query(parser, inner)
            return f"EXPLAIN {inner}"
        _require_query(parser, sql)
        return sql
    finally:
        parser.close()


def _require_query(parser: duckdb.DuckDBPyConnection, sql: str) -> None:
    statements = _statements(parser, sql)
    tokens = duckdb.tokenize(sql)
    keyword = _word(sql, tokens, 0) if tokens else ""
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kind = statements[0].type.name if len(statements) == 1 else f"{len(statements)}"
        raise SqlRefusedError(f"{keyword or kind} statements are not allowed: {_ALLOWED}")
    # PRAGMA parses as a SELECT of a pragma function; json_serialize_sql takes real queries only.
    serialized = parser.execute("SELECT json_serialize_sql($1::VARCHAR)", [sql]).fetchone()
    if (
        keyword not in _QUERY_KEYWORDS
        or serialized is None
        or json.loads(serialized[0]).get("error", False)
    ):
        raise SqlRefusedError(f"{keyword} statements are not allowed: {_ALLOWED}")


def _statements(parser: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    try:
        return parser.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlError(_clean(exc)) from None


def _word(sql: str, tokens: Sequence[tuple[int, object]], index: int) -> str:
    match = _FIRST_WORD.match(sql, tokens[index][0])
    return match.group(0).upper() if match else sql[tokens[index][0] : tokens[index][0] + 20]


def open_sandbox(
    tables: Mapping[str, TableSnapshot], *, memory_limit_bytes: int, threads: int = 1
) -> duckdb.DuckDBPyConnection:
    """A fresh database that can touch no file, with ``tables`` (one per :data:`SANDBOX_VIEWS`
    entry, by view name) as read-only views plus ``covered`` (the merged covered intervals),
    ``stale`` (arrivals no batch run has counted yet) and ``ctr`` (the merged view)."""
    missing = set(SANDBOX_VIEWS) - set(tables)
    if missing:
        raise ValueError(f"'tables' lacks the views {sorted(missing)}")
    con = duckdb.connect(
        config={
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "threads": threads,
            "memory_limit": f"{max(memory_limit_bytes // 2**20, 16)}MB",
            "temp_directory": "",
        }
    )
    try:
        con.execute("SET TimeZone = 'UTC'")
        for view in SANDBOX_VIEWS:
            con.from_arrow(_dataset(tables[view])).create_view(view)
        _create_version_views(con)
        con.execute("SET python_enable_replacements = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _create_version_views(con: duckdb.DuckDBPyConnection) -> None:
    """Per version N of ``ctr``: ``covered_vN``, ``stale_vN`` and ``ctr_vN`` (its merge rule,
    speed and late rows through its definition); ``covered``, ``stale`` and ``ctr`` are those
    of the version the snapshot's registry publishes."""
    result = con.execute("SELECT * FROM registry")
    columns = [c[0] for c in result.description]
    registry = Registry.from_rows(dict(zip(columns, r, strict=True)) for r in result.fetchall())
    published = registry.published("ctr")
    for view in versions("ctr"):
        n = view.version
        rows = con.execute(
            "SELECT interval_start, interval_end FROM coverage WHERE view = $key",
            {"key": view.key},
        ).fetchall()
        con.from_arrow(Coverage(rows).to_arrow()).create(f"covered_v{n}")
        where = f" WHERE {view.where}" if view.where else ""
        con.execute(f"CREATE VIEW speed_v{n} AS SELECT * FROM ctr_speed{where}")
        con.execute(f"CREATE VIEW arrivals_v{n} AS SELECT * FROM arrivals{where}")
        batch = batch_table(view).sql_name
        con.execute(
            f"CREATE VIEW stale_v{n} AS "
            + stale_sql(arrivals=f"arrivals_v{n}", coverage="coverage", batch=batch, view=view.key)
        )
        con.execute(
            f"CREATE VIEW ctr_v{n} AS "
            + merged_sql(
                batch=batch, speed=f"speed_v{n}", covered=f"covered_v{n}", stale=f"stale_v{n}"
            )
        )
    for name in ("covered", "stale", "ctr"):
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_v{published.version}")


def _dataset(table: TableSnapshot) -> ds.Dataset | pa.Table:
    """The table's files as an Arrow dataset (partition values from the paths, as Delta writes
    them), or an empty table of its schema."""
    if not table.files:
        return table.schema.empty_table()
    filesystem, root = pafs.FileSystem.from_uri(_uri(table.path))
    paths = [pafs.FileSystem.from_uri(_uri(f))[1] for f in table.files]
    partitioning = None
    if table.partition_columns:
        partitioning = ds.partitioning(
            pa.schema([table.schema.field(c) for c in table.partition_columns]), flavor="hive"
        )
    return ds.dataset(
        paths,
        schema=table.schema,
        format="parquet",
        filesystem=filesystem,
        partitioning=partitioning,
        partition_base_dir=root,
    )


def _uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"


def execute(
    con: duckdb.DuckDBPyConnection,
    statement: str,
    *,
    max_rows: int,
    max_bytes: int,
    timeout_s: float,
) -> SqlResult:
    """Run a checked ``statement``; rows stop at ``max_rows`` rows or ``max_bytes`` of JSON.

    A timer interrupts DuckDB at ``timeout_s`` (it notices between row batches; the worker
    pool's kill is the hard limit)."""
    started = time.perf_counter()
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        cursor = con.execute(statement)
        if cursor.description is None:  # pragma: no cover - every query has one
            raise SqlError("the statement returned no result")
        columns = [d[0] for d in cursor.description]
        types = [str(d[1]) for d in cursor.description]
        rows: list[list[object]] = []
        size = 2  # the enclosing brackets
        truncated_by: TruncatedBy | None = None
        while truncated_by is None and (batch := cursor.fetchmany(1024)):
            for record in batch:
                if len(rows) == max_rows:
                    truncated_by = "max_rows"
                    break
                row = [jsonable(v) for v in record]
                size += len(orjson.dumps(row)) + 1
                if size > max_bytes:
                    truncated_by = "max_bytes"
                    break
                rows.append(row)
    except duckdb.InterruptException:
        raise SqlError(f"the query was stopped at the time limit of {timeout_s:g} s") from None
    except duckdb.Error as exc:
        raise SqlError(_clean(exc)) from None
    finally:
        timer.cancel()
    return SqlResult(columns, types, rows, truncated_by, time.perf_counter() - started)


def _clean(exc: duckdb.Error) -> str:
    # DuckDB messages start with their kind ("Catalog Error: …"), which is what a user needs.
    return str(exc).strip()
