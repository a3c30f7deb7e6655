"""DuckDB's types as PostgreSQL's for the PostgreSQL endpoint: OIDs, names, and the values the
wire encodes from the sandbox's JSON-ready ones; the sandbox's errors as SQLSTATE codes."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest
from pg_mimic.types import encode_value, encode_value_binary

from api.errors import GateBusyError
from api.pg_statements import pg_error
from api.pg_types import pg_type, wire_rows
from serving_layer.json_values import jsonable
from serving_layer.sandbox.database import SqlError, SqlRefusedError, SqlTimeLimitError
from serving_layer.sandbox.pool import SqlBusyError


@pytest.mark.parametrize(
    ("duckdb_type", "oid", "name"),
    [
        ("BIGINT", 20, "bigint"),
        ("INTEGER", 23, "integer"),
        ("SMALLINT", 21, "smallint"),
        ("HUGEINT", 1700, "numeric"),
        ("DECIMAL(18,4)", 1700, "numeric"),
        ("DOUBLE", 701, "double precision"),
        ("VARCHAR", 25, "text"),
        ("BLOB", 17, "bytea"),
        ("BOOLEAN", 16, "boolean"),
        ("DATE", 1082, "date"),
        ("TIMESTAMP", 1114, "timestamp without time zone"),
        ("TIMESTAMP WITH TIME ZONE", 1184, "timestamp with time zone"),
        ("INTERVAL", 1186, "interval"),
        ("UUID", 2950, "uuid"),
        ("VARCHAR[]", 1009, "text[]"),
        ("INTEGER[]", 1007, "integer[]"),
        ("STRUCT(a INTEGER)", 114, "json"),
        ("MAP(VARCHAR, INTEGER)", 114, "json"),
        ("INTEGER[][]", 114, "json"),
        ("ENUM('a', 'b')", 25, "text"),
    ],
)
def test_each_duckdb_type_has_its_postgresql_type(duckdb_type: str, oid: int, name: str) -> None:
    kind = pg_type(duckdb_type)
    assert (kind.oid, kind.name) == (oid, name)


@pytest.mark.parametrize(
    ("duckdb_type", "value", "text"),
    [
        (
            "TIMESTAMP WITH TIME ZONE",
            dt.datetime(2026, 11, 30, 10, tzinfo=dt.UTC),
            "2026-11-30 10:00:00+00",
        ),
        (
            "TIMESTAMP WITH TIME ZONE",
            dt.datetime(2026, 11, 30, 10, 0, 0, 5, tzinfo=dt.UTC),
            "2026-11-30 10:00:00.000005+00",
        ),
        ("TIMESTAMP", dt.datetime(2026, 11, 30, 10, 1), "2026-11-30 10:01:00"),
        ("DECIMAL(10,4)", decimal.Decimal("0.1000"), "0.1000"),
        ("HUGEINT", 2**70, str(2**70)),
        ("DOUBLE", float("nan"), "NaN"),
        ("DOUBLE", float("-inf"), "-Infinity"),
        ("BLOB", b"\x00\xffsealed", "\\x00ff7365616c6564"),
        ("BLOB", b"plain", "\\x706c61696e"),
        ("INTERVAL", dt.timedelta(days=1, hours=2, seconds=3.5), "1 day 02:00:03.500000"),
        ("UUID", uuid.UUID(int=7), "00000000-0000-0000-0000-000000000007"),
        ("BIGINT[]", [1, None, 3], "{1,NULL,3}"),
        ("STRUCT(a INTEGER)", {"a": 1}, '{"a": 1}'),
        ("DATE", dt.date(2026, 11, 30), "2026-11-30"),
    ],
)
def test_a_value_reaches_the_wire_as_postgresql_writes_it(
    duckdb_type: str, value: object, text: str
) -> None:
    """From the sandbox's JSON-ready value (what POST /api/v1/sql sends) back to PostgreSQL's
    text of the DuckDB value."""
    kind = pg_type(duckdb_type)
    (row,) = wire_rows([kind], [[jsonable(value)]])
    assert encode_value(kind.oid, row[0]) == text


def test_binary_results_carry_the_same_instant_and_number() -> None:
    moment = pg_type("TIMESTAMP WITH TIME ZONE")
    value = moment.convert("2000-01-01T00:00:01Z")
    assert encode_value_binary(moment.oid, value) == (1_000_000).to_bytes(8, "big")
    number = pg_type("DECIMAL(10,2)")
    assert encode_value_binary(number.oid, number.convert("1.50"))[-2:] == (5000).to_bytes(2, "big")


def test_nulls_stay_null() -> None:
    assert wire_rows([pg_type("BIGINT"), pg_type("VARCHAR")], [[None, None]]) == [(None, None)]


@pytest.mark.parametrize(
    ("error", "sqlstate"),
    [
        (SqlRefusedError("DROP statements are not allowed"), "42501"),
        (SqlTimeLimitError("stopped at the time limit of 2 s", 4.2), "57014"),
        (SqlBusyError("refused for 3.0 s more", retry_after_s=3), "53000"),
        (GateBusyError("this key's share of the SQL workers is taken", 2), "53000"),
        (SqlError('Parser Error: syntax error at or near "SELEC"'), "42601"),
        (SqlError("Catalog Error: Table with name nope does not exist!"), "42P01"),
        (SqlError('Binder Error: Referenced column "nope" not found'), "42703"),
        (SqlError("Conversion Error: Could not convert string 'x' to INT64"), "22018"),
        (SqlError("the query ran out of memory (the sandbox's limit)"), "53200"),
        (SqlError("something else"), "XX000"),
    ],
)
def test_each_refusal_and_failure_has_its_sqlstate(error: Exception, sqlstate: str) -> None:
    pg = pg_error(error)
    assert pg.sqlstate == sqlstate
    assert str(error) in pg.message


def test_a_limit_says_when_to_retry() -> None:
    assert pg_error(SqlTimeLimitError("stopped", 4.2)).fields == {"H": "retry after 5 s"}


def test_a_portal_drains_its_rows_in_a_clients_fetch_size() -> None:
    """pgJDBC's setFetchSize: Executes of max_rows each, suspended until the last row."""
    import asyncio

    from api.pg_statements import _SandboxPortal
    from serving_layer.sandbox.database import SqlResult

    class Answered:
        async def answer(self, params: object, *, keep: bool) -> object:
            result = SqlResult(["n"], ["BIGINT"], [[1], [2], [3]], None, 0.0)
            return (), result, [pg_type("BIGINT")]

    portal = _SandboxPortal(Answered(), [])  # type: ignore[arg-type]
    drained = [asyncio.run(portal.execute(2)) for _ in range(2)]
    assert drained == [([(1,), (2,)], True), ([(3,)], False)]
    assert asyncio.run(_SandboxPortal(Answered(), []).execute(0)) == ([(1,), (2,), (3,)], False)  # type: ignore[arg-type]
