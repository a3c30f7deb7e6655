"""The SQL sandbox's database: which statements may run, and a DuckDB that cannot write.

Read-only by construction, in two independent layers:

1. **The statement.** DuckDB's own parser decides: exactly one statement, of type SELECT, that
   ``json_serialize_sql`` (which serializes queries and nothing else) accepts, starting with a
   query keyword; or ``EXPLAIN`` followed directly by such a query (never ``EXPLAIN ANALYZE``,
   which runs the statement). Comments are skipped by DuckDB's tokenizer, so nested comments
   mean what DuckDB thinks they mean. Every function the serialized statement calls (in
   subqueries, CTEs, window clauses, lambdas, ``COLUMNS(…)``, operators DuckDB spells as
   functions; :mod:`serving_layer.sandbox.sql_tree` finds them) must be on an allow-list: the
   SQL library an analyst needs (:mod:`serving_layer.sandbox.functions`), not DuckDB's
   scans of Python objects by address, file readers, catalog, settings or ``query()``.
   Every table it names must be one of the views the key may read (:func:`view_names`) or
   a CTE of its own in scope: not DuckDB's catalog (``information_schema``, ``pg_catalog``,
   ``duckdb_tables``…), not a file path.
2. **The database.** A fresh in-memory DuckDB with external access off from its first moment and
   no allowed paths: it cannot open, create or write any file. The lake's tables reach it as
   Arrow datasets over one snapshot's Parquet files, which Arrow opens for reading only
   (:mod:`serving_layer.sandbox.arrow_files`), with the merged views of every version
   (:mod:`serving_layer.sandbox.version_views`). Python replacement scans are off and the
   configuration is locked.

Every file of a table reads in the table's logical types, whatever Arrow types its writer
recorded (delta-rs records ``string_view`` in the files its ``DELETE`` rewrites, which Arrow's
compute cannot filter), so DuckDB's filters push down into every file
(:mod:`serving_layer.sandbox.arrow_files`).

The worker processes that run these databases add OS limits (see :mod:`serving_layer.sandbox.pool`).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import duckdb
import orjson

from access.roles import Access, Scope
from lake.catalog import (
    BATCH_COVERAGE,
    BATCH_DRIFT,
    MASTER_EVENTS,
    MASTER_REJECTED,
    REACH_CUBES,
    SERVED,
    SERVED_BY_NAME,
)
from runtime.object_store import ObjectStoreSettings
from serving_layer.errors import ServingError
from serving_layer.json_values import jsonable
from serving_layer.sandbox.arrow_files import table_rows
from serving_layer.sandbox.functions import (
    ALLOWED_FUNCTIONS,
    ALLOWED_TABLE_FUNCTIONS,
    FILE_READERS,
    FUNCTIONS_HINT,
)
from serving_layer.sandbox.sql_tree import TableReference, called_functions, table_references
from serving_layer.sandbox.version_views import create_version_views
from serving_layer.snapshots import TableSnapshot
from views import sketches
from views.columns import SKETCHES, USER_BITMAPS, USER_LISTS, USER_NUMBERS
from views.definitions import versions

SANDBOX_VIEWS: Final[Mapping[str, str]] = {t.sql_name: t.name for t in SERVED}
# Raw data: events with user ids, rejected payloads (an admin key's only).
RAW_VIEWS: Final = frozenset({MASTER_EVENTS.sql_name, MASTER_REJECTED.sql_name})
# Counted over every campaign, with no campaign to narrow them by (not an advertiser's).
UNSCOPED_VIEWS: Final = frozenset({BATCH_DRIFT.sql_name, *(t.sql_name for t in REACH_CUBES)})
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
ALLOWED_STATEMENTS: Final = (
    "the SQL endpoint is read-only and accepts one query (SELECT, WITH, FROM, VALUES, TABLE, "
    "DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of a query) over the views " + ", ".join(VIEW_NAMES)
)


TruncatedBy = Literal["max_rows", "max_bytes"]


class SqlRefusedError(ServingError, ValueError):
    """The statement is not a single read-only query (or calls a function not allowed)."""


class FunctionRefusedError(SqlRefusedError):
    """The query calls ``function``, which is not on the allow-list."""

    def __init__(self, message: str, function: str) -> None:
        super().__init__(message)
        self.function = function


class SqlError(ServingError, RuntimeError):
    """The query failed: a syntax error, an unknown table, a denied file, a resource limit, …"""


class SqlTimeLimitError(SqlError):
    """The query was stopped at the server's time limit: the server's doing as much as the
    query's (a busy machine is slower), so worth asking again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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


class TableRefusedError(SqlRefusedError):
    """The query reads ``table``, which is not one of the views the key may query."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


def check_read_only(sql: str, access: Access | None = None) -> str:
    """The statement to run for ``sql``, or :class:`SqlRefusedError` saying why not: it must
    be one read-only query that calls allowed functions only and reads only the views
    ``access`` may query (:func:`view_names`; None: an admin's) and its own CTEs.

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
            _require_query(parser, inner, access)
            return f"EXPLAIN {inner}"
        _require_query(parser, sql, access)
        return sql
    finally:
        parser.close()


# The deepest parse tree the check reads, in JSON levels (two per nested expression: about 300
# nested expressions; DuckDB's own limit is 1,000).
_MAX_TREE_DEPTH: Final = 600
_JSON_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET: Final = re.compile(r"[\[\]{}]")


def _json_depth(text: str) -> int:
    """How deeply ``text``'s JSON nests (brackets outside its strings)."""
    depth = deepest = 0
    for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _require_query(
    parser: duckdb.DuckDBPyConnection, sql: str, access: Access | None = None
) -> None:
    statements = _statements(parser, sql)
    tokens = duckdb.tokenize(sql)
    keyword = _word(sql, tokens, 0) if tokens else ""
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kind = statements[0].type.name if len(statements) == 1 else f"{len(statements)}"
        raise SqlRefusedError(f"{keyword or kind} statements are not allowed: {ALLOWED_STATEMENTS}")
    # PRAGMA parses as a SELECT of a pragma function; json_serialize_sql takes real queries only.
    serialized = parser.execute("SELECT json_serialize_sql($1::VARCHAR)", [sql]).fetchone()
    if keyword not in _QUERY_KEYWORDS or serialized is None:
        raise SqlRefusedError(f"{keyword} statements are not allowed: {ALLOWED_STATEMENTS}")
    # Measured, not left to Python's recursion limit (which an imported library may raise for
    # the whole process: Airflow's does): the check walks the tree recursively.
    if _json_depth(serialized[0]) > _MAX_TREE_DEPTH:
        raise SqlRefusedError("the query nests too deeply to be checked")
    try:
        # json, not orjson: constants may serialize as Infinity, NaN or integers past 64 bits.
        tree = json.loads(serialized[0])
    except RecursionError:
        raise SqlRefusedError("the query nests too deeply to be checked") from None
    if not isinstance(tree, dict) or tree.get("error", True):
        raise SqlRefusedError(f"{keyword} statements are not allowed: {ALLOWED_STATEMENTS}")
    for name, table in called_functions(tree):
        if name is None:
            raise SqlRefusedError("the query has a function call the check cannot read")
        _require_allowed(name, table=table)
    readable = frozenset(view_names(access))
    for ref in table_references(tree):
        _require_readable(ref, readable, access)


def view_names(access: Access | None = None) -> tuple[str, ...]:
    """The views a query of ``access`` (None: an admin's) may read: its tables of
    :func:`sandbox_views`, the merged views and their versions."""
    return (*sandbox_views(access), "covered", "stale", "ctr", *VERSION_VIEWS)


_PATH_LIKE: Final = re.compile(r"[/\\.*?:]")


def _require_readable(ref: TableReference, readable: frozenset[str], access: Access | None) -> None:
    if ref.schema or ref.catalog:
        raise TableRefusedError(
            f"the table {ref.written} is not allowed: a query reads the views by their names "
            f"alone ({', '.join(sorted(readable))}), or its own CTEs",
            ref.written,
        )
    name = ref.name.lower()
    if ref.cte or name in readable:
        return
    if name in SANDBOX_VIEWS and access is not None:
        raise TableRefusedError(
            f"the table {ref.name} is not readable with an {access.role} key "
            f"({access.name!r}); ask an admin for a key with access to it",
            ref.name,
        )
    files = " (the sandbox reads no files)" if _PATH_LIKE.search(ref.name) else ""
    close = difflib.get_close_matches(name, sorted(readable), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise TableRefusedError(
        f"the table {ref.name} is not allowed{files}{hint}: a query reads the views "
        + ", ".join(sorted(readable))
        + " and its own CTEs (SHOW TABLES lists the views)",
        ref.name,
    )


def _require_allowed(name: str, *, table: bool) -> None:
    # DuckDB folds ASCII case only; every allowed name is ASCII.
    key = name.lower() if name.isascii() else name
    if table:
        if key in ALLOWED_TABLE_FUNCTIONS:
            return
        why = (
            " (the sandbox reads no files: file system operations are disabled)"
            if FILE_READERS.match(key)
            else ""
        )
        raise FunctionRefusedError(
            f"the table function {name}() is not allowed{why}; the allowed table functions: "
            + ", ".join(sorted(ALLOWED_TABLE_FUNCTIONS)),
            name,
        )
    if key not in ALLOWED_FUNCTIONS:
        raise FunctionRefusedError(f"the function {name}() is not allowed; {FUNCTIONS_HINT}", name)


def _statements(parser: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    try:
        return parser.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlError(_clean(exc)) from None


def _word(sql: str, tokens: Sequence[tuple[int, object]], index: int) -> str:
    match = _FIRST_WORD.match(sql, tokens[index][0])
    return match.group(0).upper() if match else sql[tokens[index][0] : tokens[index][0] + 20]


def sandbox_views(access: Access | None = None) -> Mapping[str, str]:
    """The tables ``access`` may query (SQL name -> table name; None: an admin's): an admin
    every one of :data:`SANDBOX_VIEWS`, an analyst all but the raw ones, an advertiser neither
    the raw ones nor those counted over every campaign."""
    if access is None or access.raw_tables:
        return SANDBOX_VIEWS
    hidden = RAW_VIEWS if access.sees_everything else RAW_VIEWS | UNSCOPED_VIEWS
    return {view: name for view, name in SANDBOX_VIEWS.items() if view not in hidden}


def hidden_views(access: Access | None = None) -> frozenset[str]:
    """The tables of :data:`SANDBOX_VIEWS` that ``access`` may not query."""
    return frozenset(SANDBOX_VIEWS) - set(sandbox_views(access))


def open_sandbox(
    tables: Mapping[str, TableSnapshot],
    store: ObjectStoreSettings,
    *,
    memory_limit_bytes: int,
    threads: int = 1,
    access: Access | None = None,
) -> duckdb.DuckDBPyConnection:
    """A fresh database that can touch no file, with ``tables`` (one per entry of
    :func:`sandbox_views` of ``access``, by view name) as read-only views plus ``covered`` (the
    merged covered intervals), ``stale`` (arrivals no batch run has counted yet) and ``ctr``
    (the merged view), and the same per version.

    For an advertiser every table with a ``campaign_id`` holds the scope's rows only, and
    coverage no row counts, before any view is made of them: the database holds no other row,
    so no query, function or view of it can reach one. Tables ``access`` may not query are not
    in the database at all."""
    allowed = sandbox_views(access)
    missing = set(allowed) - set(tables)
    if missing:
        raise ValueError(f"'tables' lacks the views {sorted(missing)}")
    scope = access.scope if access is not None else None
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
        users_hidden = access is not None and not access.raw_tables
        # User-level data is an admin's: below admin, sketches are sealed (they hold every
        # user's hash in their small modes) and can only be unioned and estimated.
        seal = sketches.SketchSeal() if users_hidden else None
        sketches.register(con, seal)
        for view, name in allowed.items():
            rows = table_rows(con, tables[view], store)
            table = SERVED_BY_NAME[name]
            if seal is not None:
                rows = _without_users(rows, seal)
            if scope is not None:
                if "campaign_id" in table.schema.names:
                    rows = rows.filter(_in_scope(scope))
                if table is BATCH_COVERAGE:  # rows written: a count over every campaign
                    rows = rows.project(
                        ", ".join(
                            "NULL::BIGINT AS rows_written" if c == "rows_written" else c
                            for c in table.schema.names
                        )
                    )
            if table.summed_by:  # partial counts (speed/ctr): one row per key
                rows = rows.aggregate(table.summed_select(), ", ".join(table.summed_by))
            rows.create_view(view)
        create_version_views(con)
        con.execute("SET python_enable_replacements = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _without_users(
    rows: duckdb.DuckDBPyRelation, seal: sketches.SketchSeal
) -> duckdb.DuckDBPyRelation:
    """``rows`` without user ids (the lists, of ids or of numbers, and the bitmaps of numbers:
    raw data, an admin's) and with sealed sketches."""
    hidden = {*USER_LISTS, *USER_NUMBERS, *USER_BITMAPS}
    if not (hidden | set(SKETCHES)) & set(rows.columns):
        return rows
    return rows.project(
        ", ".join(
            f"{seal.function}({c}) AS {c}" if c in SKETCHES else c
            for c in rows.columns
            if c not in hidden
        )
    )


def _in_scope(scope: Scope) -> duckdb.Expression:
    """The rows of ``scope`` as a DuckDB expression (its ids constants, never SQL text)."""
    condition = duckdb.ColumnExpression("campaign_id").isin(
        *(duckdb.ConstantExpression(c) for c in scope.campaigns)
    )
    if scope.ads:
        condition = condition & duckdb.ColumnExpression("ad_id").isin(
            *(duckdb.ConstantExpression(a) for a in scope.ads)
        )
    return condition


def execute(
    con: duckdb.DuckDBPyConnection,
    statement: str,
    *,
    max_rows: int,
    max_bytes: int,
    timeout_s: float,
    params: Sequence[str | None] = (),
) -> SqlResult:
    """Run a checked ``statement`` with ``params`` bound to its ``$1``, ``$2``…; rows stop at
    ``max_rows`` rows or ``max_bytes`` of JSON.

    A timer interrupts DuckDB at ``timeout_s`` (it notices between row batches; the worker
    pool's kill is the hard limit)."""
    started = time.perf_counter()
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        cursor = con.execute(statement, list(params)) if params else con.execute(statement)
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


@functools.cache
def _columns_by_reach(
    store: ObjectStoreSettings, raw_tables: bool, sees_everything: bool
) -> dict[str, list[tuple[str, str]]]:
    # A stand-in of the role: the views and columns depend on it, not on the key.
    access: Access | None = None
    if not sees_everything:
        access = Access("columns", "advertiser", Scope(campaigns=("c",)))
    elif not raw_tables:
        access = Access("columns", "analyst")
    tables = {
        view: TableSnapshot(name, "", None, (), (), SERVED_BY_NAME[name].schema)
        for view, name in sandbox_views(access).items()
    }
    con = open_sandbox(tables, store, memory_limit_bytes=256 * 2**20, access=access)
    try:
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE NOT internal ORDER BY table_name, column_index"
        ).fetchall()
    finally:
        con.close()
    columns: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in rows:
        columns.setdefault(table, []).append((column, kind))
    return columns


def view_columns(
    store: ObjectStoreSettings, access: Access | None = None
) -> dict[str, list[tuple[str, str]]]:
    """Each view a query of ``access`` (None: an admin's) may read, with its columns and their
    DuckDB types, as a query sees them (user ids hidden and sketches sealed below admin): the
    sandbox's own views over tables with no rows, so nothing of the lake is read. What SQL
    clients list as the database's tables (the PostgreSQL endpoint's catalog). ``store`` is
    the lake's (no file is read)."""
    if access is None:
        return _columns_by_reach(store, True, True)
    return _columns_by_reach(store, access.raw_tables, access.sees_everything)
