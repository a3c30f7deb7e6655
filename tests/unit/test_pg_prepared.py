"""SQL's PREPARE / EXECUTE / DEALLOCATE on the PostgreSQL endpoint: constants only, bound as
parameters, per connection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pg_mimic.errors import PgError

from api.pg_prepared import MAX_PREPARED, _constants, prepared_statement
from api.pg_statements import SandboxStatement


@pytest.mark.parametrize(
    ("arguments", "values"),
    [
        ("'cmp-1'", ["cmp-1"]),
        ("'it''s', 42, -7, 1.5", ["it's", "42", "-7", "1.5"]),
        ("NULL, true, false", [None, "true", "false"]),
        ("'2026-11-30 10:00:00+00'::timestamptz", ["2026-11-30 10:00:00+00"]),
        ("", []),
    ],
)
def test_execute_takes_constants(arguments: str, values: list[str | None]) -> None:
    assert _constants(arguments) == values


@pytest.mark.parametrize(
    "arguments", ["lower('A')", "(SELECT 1)", "a_column", "1 + 1", "read_csv('/etc/passwd')"]
)
def test_execute_refuses_anything_but_constants(arguments: str) -> None:
    with pytest.raises(PgError) as refused:
        _constants(arguments)
    assert refused.value.sqlstate == "42601"


def test_prepare_execute_deallocate_by_name() -> None:
    session: Any = object()
    prepared: dict[str, str] = {}
    prepare = prepared_statement(session, prepared, "PREPARE q (text) AS SELECT $1 AS x;")
    assert prepare is not None
    assert prepared == {}, "stored when it runs, not when parsed"
    asyncio.run(prepare.bind([]).execute(0))
    assert prepared == {"q": "SELECT $1 AS x"}
    execute = prepared_statement(session, prepared, "execute Q('v')")
    assert isinstance(execute, SandboxStatement)
    assert (execute.sql, execute._bound) == ("SELECT $1 AS x", ["v"])
    with pytest.raises(PgError, match="already exists"):
        prepared_statement(session, prepared, "PREPARE q AS SELECT 1")
    with pytest.raises(PgError, match="does not exist"):
        prepared_statement(session, prepared, "EXECUTE nope")
    assert prepared_statement(session, prepared, "SELECT 1") is None
    deallocate = prepared_statement(session, prepared, "DEALLOCATE q")
    assert deallocate is not None
    asyncio.run(deallocate.bind([]).execute(0))
    assert prepared == {}


def test_a_connection_keeps_a_bounded_number_of_prepared_queries() -> None:
    prepared = {f"q{i}": "SELECT 1" for i in range(MAX_PREPARED)}
    with pytest.raises(PgError, match=f"at most {MAX_PREPARED}"):
        prepared_statement(object(), prepared, "PREPARE one_more AS SELECT 1")  # type: ignore[arg-type]
