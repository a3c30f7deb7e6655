"""Read-only ad-hoc SQL over the platform's tables, in a locked-down DuckDB.

Every call gets a fresh in-memory database holding one snapshot of the lake as views:
``events``, ``rejected``, ``ctr_batch``, ``ctr_speed``, ``coverage``, ``covered`` (the covered
intervals, merged) and ``ctr`` (the merged view at minute grain, with ``source`` and
``run_id``). Then external access is switched off except for exactly those Parquet files, Python
replacement scans are off, the configuration is locked, and only a single read-only statement
is accepted. A timer interrupts the query at the time limit.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import duckdb
import pyarrow as pa

from serving_layer.coverage import Coverage
from serving_layer.query import merged_sql
from serving_layer.relations import create_arrow_table, create_relation, quote_literal
from serving_layer.tables import LakeSnapshot

SANDBOX_VIEWS: Final[Mapping[str, str]] = {
    "events": "master/events",
    "rejected": "master/rejected",
    "ctr_batch": "batch/ctr",
    "ctr_speed": "speed/ctr",
    "coverage": "batch/coverage",
}
_READ_ONLY_TYPES: Final = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
_READ_ONLY_KEYWORDS: Final = frozenset(
    {"SELECT", "WITH", "FROM", "VALUES", "TABLE", "DESCRIBE", "SHOW", "SUMMARIZE", "EXPLAIN", "("}
)
_LEADING_COMMENTS: Final = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.DOTALL)


class SqlRefusedError(ValueError):
    """The statement is not a single read-only query."""


class SqlError(RuntimeError):
    """The query failed: a syntax error, an unknown table, a denied file, the time limit, …"""


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[object, ...]]
    truncated: bool
    elapsed_s: float


def run_sql(
    sql: str,
    snapshot: LakeSnapshot,
    *,
    max_rows: int = 10_000,
    timeout_s: float = 10.0,
    memory_limit: str = "1GB",
    threads: int = 2,
) -> SqlResult:
    """Run one read-only statement over ``snapshot``; at most ``max_rows`` rows come back.

    Raises :class:`SqlRefusedError` for anything but a single read-only query and
    :class:`SqlError` when it fails or runs longer than ``timeout_s``.
    """
    if max_rows < 1:
        raise ValueError(f"'max_rows' must be >= 1, got {max_rows}")
    if timeout_s <= 0:
        raise ValueError(f"'timeout_s' must be > 0, got {timeout_s}")
    con = sandbox(snapshot, memory_limit=memory_limit, threads=threads)
    started = time.perf_counter()
    timer = threading.Timer(timeout_s, con.interrupt)
    try:
        statement = check_read_only(con, sql)
        timer.start()
        try:
            cursor = con.execute(statement)
            if cursor.description is None:  # pragma: no cover - every read-only query has one
                raise SqlError("the statement returned no result")
            columns = [d[0] for d in cursor.description]
            types = [str(d[1]) for d in cursor.description]
            rows = cursor.fetchmany(max_rows + 1)
        except duckdb.InterruptException:
            raise SqlError(f"the query was stopped at the time limit of {timeout_s:g} s") from None
        except duckdb.Error as exc:
            raise SqlError(_clean(exc)) from None
    finally:
        timer.cancel()
        con.close()
    return SqlResult(
        columns=columns,
        types=types,
        rows=rows[:max_rows],
        truncated=len(rows) > max_rows,
        elapsed_s=time.perf_counter() - started,
    )


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The one read-only statement in ``sql``, or :class:`SqlRefusedError` saying why not."""
    if not sql.strip():
        raise SqlRefusedError("the query is empty")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlError(_clean(exc)) from None
    if len(statements) != 1:
        raise SqlRefusedError(f"one statement per query, got {len(statements)}")
    [statement] = statements
    # The original text: DuckDB rewrites some statements (PRAGMA x becomes a SELECT).
    text = _LEADING_COMMENTS.sub("", sql)
    match = re.match(r"\(|[A-Za-z_]+", text)
    keyword = match.group(0).upper() if match else text[:20]
    # PRAGMA statements parse as SELECTs of pragma functions: the keyword check catches them.
    if statement.type not in _READ_ONLY_TYPES or keyword not in _READ_ONLY_KEYWORDS:
        raise SqlRefusedError(
            f"{keyword} statements are not allowed: the SQL endpoint is read-only and accepts "
            "one query (SELECT, WITH, FROM, VALUES, TABLE, DESCRIBE, SHOW, SUMMARIZE or "
            f"EXPLAIN) over the views {', '.join([*SANDBOX_VIEWS, 'covered', 'ctr'])}"
        )
    return sql


def sandbox(
    snapshot: LakeSnapshot, *, memory_limit: str = "1GB", threads: int = 2
) -> duckdb.DuckDBPyConnection:
    """A fresh locked-down database with the snapshot's tables as views (see module doc)."""
    con = duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "threads": threads,
            "memory_limit": memory_limit,
            "temp_directory": "",
        }
    )
    try:
        con.execute("SET TimeZone = 'UTC'")
        files: list[str] = []
        for view, table_name in SANDBOX_VIEWS.items():
            table = snapshot[table_name]
            create_relation(con, view, table, materialize=False)
            files.extend(table.files)
        rows = con.execute(
            "SELECT interval_start, interval_end FROM coverage WHERE view = 'ctr'"
        ).fetchall()
        intervals = Coverage(rows).intervals
        ts = pa.timestamp("us", tz="UTC")
        create_arrow_table(
            con,
            "covered",
            pa.table(
                {
                    "interval_start": pa.array([i.start for i in intervals], ts),
                    "interval_end": pa.array([i.end for i in intervals], ts),
                }
            ),
        )
        con.execute(
            "CREATE VIEW ctr AS "
            + merged_sql(batch="ctr_batch", speed="ctr_speed", covered="covered")
        )
        con.execute(f"SET allowed_paths = [{', '.join(quote_literal(f) for f in files)}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET python_enable_replacements = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _clean(exc: duckdb.Error) -> str:
    # DuckDB messages start with their kind ("Catalog Error: …"), which is what a user needs.
    return str(exc).strip()
