"""The catalog SQL clients send to a PostgreSQL server, answered for the PostgreSQL endpoint
(:mod:`api.pg_wire`) from the views a key may read, never from DuckDB's own catalog.

pg-mimic answers ``information_schema`` and ``pg_catalog`` queries from the session's declared
schema with sqlglot's executor, but only at Parse, with no parameter values; pgJDBC's
``DatabaseMetaData.getTables`` and SQLAlchemy's inspector bind theirs (``nspname LIKE $1``). A
:class:`CatalogStatement` evaluates the query at Bind, with the values put in as literals,
over pg-mimic's tables plus the empty ones clients join that it lacks (``pg_description``:
no view has a comment). ``version()`` answers as PostgreSQL's does, which SQLAlchemy parses.

Uses pg-mimic's catalog builders (``_build_pg_catalog``, ``_as_statement``; pinned 0.1.3),
checked by the endpoint's tests with psql, psycopg, SQLAlchemy and pgJDBC.
"""

from __future__ import annotations

import re
from typing import Any, Final

import sqlglot
from pg_mimic import ResultColumn, StaticStatement
from pg_mimic import catalog as mimic_catalog
from pg_mimic.catalog_data import DECLARED_TYPE_OIDS
from pg_mimic.catalog_rewrite import rewrite_for_executor
from pg_mimic.middleware import _substitute_session_functions
from pg_mimic.session import Portal, Statement
from pg_mimic.types import TEXT
from sqlglot import exp

# What version() says: "PostgreSQL <major>.<minor>" is what SQLAlchemy and Grafana parse.
VERSION_TEXT: Final = "PostgreSQL 16.0 (ctr-lambda: the views of ad click-through analytics)"
_VERSION_QUERY: Final = re.compile(
    r"\s*select\s+(?:pg_catalog\s*\.\s*)?version\s*\(\s*\)\s*(?:as\s+\w+\s*)?;?\s*", re.IGNORECASE
)
# Catalog tables clients join that pg-mimic does not model: empty, with their columns.
_EMPTY_TABLES: Final[dict[str, dict[str, str]]] = {
    "pg_description": {
        "objoid": "INT",
        "classoid": "INT",
        "objsubid": "INT",
        "description": "TEXT",
    },
}


# The columns are declared by PostgreSQL's own names of their types (format_type's: SQLAlchemy
# reflects by them); pg-mimic maps names to type OIDs, and lacks these three.
DECLARED_TYPE_OIDS.setdefault("timestamp with time zone", "TIMESTAMPTZ")
DECLARED_TYPE_OIDS.setdefault("timestamp without time zone", "TIMESTAMP")
DECLARED_TYPE_OIDS.setdefault("time without time zone", "TIME")


def version_statement(sql: str) -> Statement | None:
    """``SELECT version()`` (or ``pg_catalog.version()``), answered; None for anything else."""
    if _VERSION_QUERY.fullmatch(sql) is None:
        return None
    return StaticStatement(sql, [ResultColumn("version", TEXT)], [(VERSION_TEXT,)])


_ISOLATION: Final = re.compile(r"\s*show\s+transaction\s+isolation\s+level\s*;?\s*", re.I)
_SANDBOX_SHOW: Final = re.compile(r"\s*show\s+(?:all\s+)?tables\b", re.IGNORECASE)


def show_statement(sql: str, views: Any) -> Statement | bool | None:
    """``SHOW TRANSACTION ISOLATION LEVEL`` answered (SQLAlchemy asks it on connecting);
    True for DuckDB's ``SHOW TABLES`` and ``SHOW <view>``, which are the sandbox's (not a
    setting's name); None for anything else."""
    if _ISOLATION.fullmatch(sql):
        return StaticStatement(
            sql, [ResultColumn("transaction_isolation", TEXT)], [("read committed",)]
        )
    if _SANDBOX_SHOW.match(sql):
        return True
    words = sql.split()
    if len(words) == 2 and words[0].lower() == "show" and words[1].strip(";").lower() in views:
        return True
    return None


_SAVEPOINT: Final = re.compile(
    r"\s*(?:(savepoint)|(release)(?:\s+savepoint)?|(rollback)\s+to(?:\s+savepoint)?)\s+\S+\s*;?\s*",
    re.IGNORECASE,
)


def savepoint_statement(connection: Any, sql: str) -> Statement | None:
    """``SAVEPOINT``, ``RELEASE`` and ``ROLLBACK TO`` (psycopg's nested transactions, which
    SQLAlchemy and pandas open): nothing to keep on a read-only server; a rollback to a
    savepoint ends the failed state and keeps the transaction. None for anything else."""
    match = _SAVEPOINT.fullmatch(sql)
    if match is None:
        return None
    tag = next(word.upper() for word in match.groups() if word)

    def on_execute() -> None:
        if tag == "ROLLBACK" and connection.tx_status == b"E":
            connection.tx_status = b"T"

    return StaticStatement(tag, None, [], on_execute)


def catalog_query(sql: str) -> exp.Query | None:
    """``sql`` parsed, when it reads ``information_schema`` or ``pg_catalog`` (or a bare
    ``pg_*`` table, as psql writes them); None otherwise (the sandbox's, then)."""
    lowered = sql.lower()
    if "information_schema" not in lowered and "pg_" not in lowered:
        return None
    try:
        expression = sqlglot.parse_one(sql, dialect="postgres")
    except Exception:  # sqlglot cannot read it: not a catalog query it could answer
        return None
    if not isinstance(expression, exp.Query):
        return None
    for table in expression.find_all(exp.Table):
        schema = (table.db or "").lower()
        if schema in ("information_schema", "pg_catalog") or (
            not schema and table.name.lower().startswith("pg_")
        ):
            return expression
    return None


class CatalogStatement(Statement):
    """A catalog query, evaluated when its parameters are bound (at Describe before any Bind:
    with NULLs, for the columns)."""

    def __init__(self, connection: Any, sql: str, expression: exp.Query) -> None:
        self.connection = connection
        self.sql = sql
        self.param_oids: list[int | None] = []
        self.expression = expression
        self._bound: list[str | None] = []
        self._answers: dict[tuple[str | None, ...], Statement] = {}

    async def describe(self) -> list[ResultColumn] | None:
        return await (await self.answer(self._bound)).describe()

    def bind(self, params: list[str | None]) -> Portal:
        self._bound = [None if p is None else str(p) for p in params]
        return _CatalogPortal(self, self._bound)

    async def answer(self, params: list[str | None]) -> Statement:
        key = tuple(params)
        answer = self._answers.get(key)
        if answer is None:
            bound = _with_literals(self.expression, params)
            answer = await _evaluate(self.connection, bound)
            self._answers = {key: answer}  # the last one: Bind, Describe, Execute
        return answer


class _CatalogPortal(Portal):
    def __init__(self, statement: CatalogStatement, params: list[str | None]) -> None:
        self.statement = statement
        self.params = params
        self._portal: Portal | None = None

    async def execute(self, max_rows: int) -> tuple[list[tuple[object, ...]], bool]:
        if self._portal is None:
            self._portal = (await self.statement.answer(self.params)).bind([])
        rows, suspended = await self._portal.execute(max_rows)
        return rows, suspended


def _with_literals(expression: exp.Query, params: list[str | None]) -> exp.Query:
    """``expression`` with each ``$n`` replaced by the n-th value as a literal (NULL when
    missing): parsed SQL nodes, so a value is never read as SQL."""
    bound = expression.copy()
    for node in list(bound.find_all(exp.Parameter)):
        index = node.this
        if not isinstance(index, exp.Literal) or index.is_string:
            continue
        position = int(index.this) - 1
        value = params[position] if 0 <= position < len(params) else None
        node.replace(exp.null() if value is None else exp.Literal.string(value))
    return bound


def _any_as_in(expression: exp.Query) -> exp.Query:
    """``x = ANY(ARRAY[a, b])`` (SQLAlchemy's, for relkind) as ``x IN (a, b)``, which
    sqlglot's executor runs."""
    for node in list(expression.find_all(exp.Any)):
        parent, array = node.parent, node.this
        if isinstance(array, exp.Paren):
            array = array.this
        if isinstance(array, exp.Array) and isinstance(parent, exp.EQ):
            parent.replace(exp.In(this=parent.this, expressions=list(array.expressions)))
    return expression


async def _evaluate(connection: Any, expression: exp.Query) -> Statement:
    # current_database(), current_schema(), current_user…: the connection's, as literals.
    expression, _, _ = _substitute_session_functions(connection, expression)
    expression = _any_as_in(expression)
    user_schema = await connection.session.schema()
    tables = [t for t in expression.find_all(exp.Table)]
    if any((t.db or "").lower() == "information_schema" for t in tables):
        return await mimic_catalog.information_schema_statement(connection, expression)
    schema, rows = mimic_catalog._build_pg_catalog(user_schema)
    schema = {"pg_catalog": {**schema["pg_catalog"], **_EMPTY_TABLES}}
    rows = {"pg_catalog": {**rows["pg_catalog"], **{name: [] for name in _EMPTY_TABLES}}}
    statement: Statement | None = mimic_catalog._as_statement(
        rewrite_for_executor(connection, expression), schema, rows
    )
    if statement is None:
        return StaticStatement(expression.sql(dialect="postgres"), None, [])
    return statement
