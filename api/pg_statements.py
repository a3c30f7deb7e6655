"""The PostgreSQL endpoint's queries of the sandbox (:mod:`api.pg_wire`): a statement that runs
at its Describe or Execute under ``POST /api/v1/sql``'s rules, its portal, and the sandbox's and
the API's errors as PostgreSQL's (SQLSTATE codes, the HTTP answer's message)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Final, Protocol

import duckdb
from pg_mimic import ResultColumn
from pg_mimic import messages as pg_messages
from pg_mimic.errors import PgError
from pg_mimic.session import Portal, Statement

from api.errors import GateBusyError, LimitsUnavailableError, ServerLimitError
from api.pg_types import PgType, pg_type, wire_rows
from api.settings import ApiSettings
from serving_layer.sandbox.database import (
    SqlError,
    SqlRefusedError,
    SqlResult,
    SqlTimeLimitError,
)
from serving_layer.sandbox.pool import SandboxUnavailableError, SqlBusyError
from serving_layer.snapshots import AsOfError

log = logging.getLogger("ctr.pg")
_MAX_PARAMS: Final = 1000


class Runner(Protocol):
    """The connection's session, as a statement uses it."""

    settings: ApiSettings
    connection: Any

    async def run(self, sql: str, params: Sequence[str | None]) -> SqlResult: ...


class SandboxStatement(Statement):
    """A query of the sandbox. Its columns are known once it ran: a Describe runs it with the
    parameters of the last Bind (NULLs before any), and the Execute that follows takes that
    answer rather than running it again (pg-mimic describes a statement right after each Bind;
    a simple query describes, binds no parameters and executes). ``values``: the parameters of
    SQL's ``EXECUTE name(…)``, bound in place of none."""

    def __init__(
        self,
        session: Runner,
        sql: str,
        param_oids: list[int | None],
        values: list[str | None] | None = None,
    ) -> None:
        self.session = session
        self.sql = sql
        self.param_oids = param_oids
        self._values = values
        self._bound: list[str | None] | None = values
        self._answer: tuple[tuple[str | None, ...], SqlResult, list[PgType]] | None = None

    async def describe(self) -> list[ResultColumn] | None:
        params = self._bound if self._bound is not None else [None] * self._param_count()
        _, result, types = await self.answer(params, keep=True)
        return [ResultColumn(name, t.oid) for name, t in zip(result.columns, types, strict=True)]

    def bind(self, params: list[str | None]) -> Portal:
        if len(params) > _MAX_PARAMS:
            raise PgError("54023", f"at most {_MAX_PARAMS} parameters, got {len(params)}")
        values = [None if p is None else str(p) for p in params]
        if not values and self._values is not None:
            values = self._values
        self._bound = values
        return _SandboxPortal(self, values)

    async def answer(
        self, params: Sequence[str | None], *, keep: bool
    ) -> tuple[tuple[str | None, ...], SqlResult, list[PgType]]:
        """The answer for ``params``: the one a Describe kept (taken), else a new run (kept
        for the Execute to come when ``keep``)."""
        wanted = tuple(params)
        if self._answer is not None and self._answer[0] == wanted:
            answer = self._answer
            if not keep:
                self._answer = None
            return answer
        result = await self.session.run(self.sql, wanted)
        types = [pg_type(kind) for kind in result.types]
        answer = (wanted, result, types)
        self._answer = answer if keep else None
        return answer

    def _param_count(self) -> int:
        if self.param_oids:
            return len(self.param_oids)
        parser = duckdb.connect(config={"enable_external_access": False})
        try:
            statements = parser.extract_statements(self.sql)
        except duckdb.Error:
            return 0  # the run says what is wrong with it
        finally:
            parser.close()
        return len(statements[0].named_parameters) if len(statements) == 1 else 0


class _SandboxPortal(Portal):
    """A bound query; its rows drained by Executes (a client's fetch size: several)."""

    def __init__(self, statement: SandboxStatement, params: list[str | None]) -> None:
        self.statement = statement
        self.params = params
        self._rows: list[tuple[object, ...]] | None = None
        self._sent = 0

    async def execute(self, max_rows: int) -> tuple[list[tuple[object, ...]], bool]:
        if self._rows is None:
            _, result, types = await self.statement.answer(self.params, keep=False)
            if result.truncated_by is not None:
                self._warn(result)
            self._rows = wire_rows(types, result.rows)
        start = self._sent
        end = len(self._rows) if max_rows <= 0 else min(len(self._rows), start + max_rows)
        self._sent = end
        return self._rows[start:end], end < len(self._rows)

    def _warn(self, result: SqlResult) -> None:
        settings = self.statement.session.settings
        limit = (
            f"{settings.sql_max_rows} rows (API_SQL_MAX_ROWS)"
            if result.truncated_by == "max_rows"
            else f"{int(settings.sql_max_bytes)} bytes (API_SQL_MAX_BYTES)"
        )
        connection = self.statement.session.connection
        connection.stream.write(
            pg_messages.make_notice_response(
                {
                    "S": "WARNING",
                    "V": "WARNING",
                    "C": "01000",
                    "M": f"the answer was cut off at {limit}: {len(result.rows)} rows sent",
                    "H": "narrow the query (a WHERE, a LIMIT, an aggregate)",
                }
            )
        )


# DuckDB's error kinds (the first words of its messages) as SQLSTATE codes.
_DUCKDB_KINDS: Final = (
    ("Parser Error", "42601"),
    ("Catalog Error: Table", "42P01"),
    ("Catalog Error: Scalar Function", "42883"),
    ("Catalog Error", "42704"),
    ("Binder Error: Referenced column", "42703"),
    ("Binder Error: No function matches", "42883"),
    ("Binder Error", "42000"),
    ("Conversion Error", "22018"),
    ("Invalid Input Error", "22023"),
    ("Out of Range Error", "22003"),
    ("Out of Memory Error", "53200"),
)


def pg_error(exc: Exception) -> PgError:  # noqa: PLR0911 - one return per kind
    """A sandbox's or the API's refusal or failure as the PostgreSQL error a client gets:
    the HTTP answer's message, with a SQLSTATE code by its kind."""
    if isinstance(exc, PgError):
        return exc
    if isinstance(exc, SqlRefusedError):
        return PgError("42501", f"refused: {exc}")
    if isinstance(exc, SqlTimeLimitError):
        return PgError("57014", str(exc), H=_retry_hint(exc.retry_after_s))
    if isinstance(exc, SqlBusyError | GateBusyError | ServerLimitError):
        return PgError("53000", str(exc), H=_retry_hint(exc.retry_after_s))
    if isinstance(exc, LimitsUnavailableError):
        return PgError("53000", str(exc), H=_retry_hint(1))
    if isinstance(exc, SandboxUnavailableError | AsOfError):
        return PgError("58000", str(exc))
    if isinstance(exc, SqlError):
        message = str(exc)
        if "ran out of memory" in message:
            return PgError("53200", f"query failed: {message}")
        for kind, sqlstate in _DUCKDB_KINDS:
            if message.startswith(kind):
                return PgError(sqlstate, f"query failed: {message}")
        return PgError("XX000", f"query failed: {message}")
    log.exception("the PostgreSQL endpoint's query failed", exc_info=exc)
    return PgError("XX000", f"{type(exc).__name__}: {exc}")


def _retry_hint(seconds: float) -> str:
    return f"retry after {max(1, math.ceil(seconds))} s"
