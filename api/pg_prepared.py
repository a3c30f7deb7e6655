"""SQL's own ``PREPARE``, ``EXECUTE`` and ``DEALLOCATE`` on the PostgreSQL endpoint, per
connection: psql before version 16 has no ``\\bind``, and this is how its users (and scripts)
bind parameters. The prepared query is the sandbox's to check when it runs; ``EXECUTE`` takes
constants only (strings, numbers, booleans, NULL), bound as the query's ``$1``, ``$2``…, never
written into its text."""

from __future__ import annotations

import re
from typing import Final

import sqlglot
from pg_mimic import StaticStatement
from pg_mimic.errors import PgError
from pg_mimic.session import Statement
from sqlglot import exp

from api.pg_statements import Runner, SandboxStatement

_PREPARE: Final = re.compile(
    r"\s*prepare\s+(\w+)\s*(?:\([^)]*\))?\s+as\s+(.+?)\s*;?\s*", re.IGNORECASE | re.DOTALL
)
_EXECUTE: Final = re.compile(
    r"\s*execute\s+(\w+)\s*(?:\((.*)\))?\s*;?\s*", re.IGNORECASE | re.DOTALL
)
_DEALLOCATE: Final = re.compile(r"\s*deallocate\s+(?:prepare\s+)?(\w+)\s*;?\s*", re.IGNORECASE)
MAX_PREPARED: Final = 100


def prepared_statement(session: Runner, prepared: dict[str, str], sql: str) -> Statement | None:
    """The statement for SQL's PREPARE, EXECUTE or DEALLOCATE (``prepared``: the connection's
    prepared queries by name); None for any other SQL."""
    if match := _PREPARE.fullmatch(sql):
        name, query = match.group(1).lower(), match.group(2)
        if name in prepared:
            raise PgError("42P05", f'prepared statement "{name}" already exists')
        if len(prepared) >= MAX_PREPARED:
            raise PgError("54000", f"at most {MAX_PREPARED} prepared statements a connection")
        return StaticStatement("PREPARE", None, [], lambda: prepared.__setitem__(name, query))
    if match := _EXECUTE.fullmatch(sql):
        name = match.group(1).lower()
        if name not in prepared:
            raise PgError("26000", f'prepared statement "{name}" does not exist')
        return SandboxStatement(session, prepared[name], [], _constants(match.group(2) or ""))
    if match := _DEALLOCATE.fullmatch(sql):
        name = match.group(1).lower()
        if name == "all":
            return StaticStatement("DEALLOCATE ALL", None, [], prepared.clear)
        if name not in prepared:
            raise PgError("26000", f'prepared statement "{name}" does not exist')
        return StaticStatement("DEALLOCATE", None, [], lambda: prepared.pop(name, None))
    return None


def _constants(arguments: str) -> list[str | None]:
    """EXECUTE's arguments as parameter values: constants only."""
    if not arguments.strip():
        return []
    try:
        select = sqlglot.parse_one(f"SELECT {arguments}", dialect="postgres")
    except Exception:
        raise PgError("42601", f"EXECUTE's arguments are not constants: ({arguments})") from None
    values: list[str | None] = []
    for argument in select.expressions:
        value = argument.unalias() if isinstance(argument, exp.Alias) else argument
        if isinstance(value, exp.Cast):  # '2026-11-30'::timestamptz: the constant; DuckDB casts
            value = value.this
        if isinstance(value, exp.Null):
            values.append(None)
        elif isinstance(value, exp.Boolean):
            values.append("true" if value.this else "false")
        elif isinstance(value, exp.Literal):
            values.append(str(value.this))
        elif isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal):
            values.append(f"-{value.this.this}")
        else:
            raise PgError(
                "42601", f"EXECUTE takes constants only, got {value.sql(dialect='postgres')}"
            )
    return values
