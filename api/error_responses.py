"""Error responses, mapped in this one place: every error is JSON; every 4xx says what is wrong
and, for bad input, which parameter."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.errors import (
    GateBusyError,
    LimitsUnavailableError,
    NotAcceptableError,
    NotFoundError,
    ParameterError,
    ServerLimitError,
)
from api.security_headers import SECURITY_HEADERS
from serving_layer.reader import QueryLimitError, QueryTimeLimitError
from serving_layer.sandbox.pool import SandboxUnavailableError, SqlBusyError

_log = logging.getLogger(__name__)


def install(app: FastAPI) -> None:
    @app.exception_handler(ParameterError)
    async def _parameter(request: Request, exc: ParameterError) -> JSONResponse:
        detail = f"{exc.parameter}: {exc.message}" if exc.parameter else exc.message
        return JSONResponse({"detail": detail, "parameter": exc.parameter}, status_code=400)

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        detail = f"{exc.parameter}: {exc.message}"
        return JSONResponse({"detail": detail, "parameter": exc.parameter}, status_code=404)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own checks (types, bounds, body shape) as 400s shaped like ours.
        errors = exc.errors()
        first = errors[0] if errors else {}
        location = [str(part) for part in first.get("loc", ()) if part not in ("query", "body")]
        parameter = ".".join(location) or None
        message = str(first.get("msg", "invalid request"))
        detail = f"{parameter}: {message}" if parameter else message
        return JSONResponse({"detail": detail, "parameter": parameter}, status_code=400)

    @app.exception_handler(NotAcceptableError)
    async def _not_acceptable(request: Request, exc: NotAcceptableError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "parameter": "Accept"}, status_code=406)

    @app.exception_handler(SqlBusyError)
    async def _busy(request: Request, exc: SqlBusyError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "parameter": None},
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(GateBusyError)
    async def _gate_busy(request: Request, exc: GateBusyError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "parameter": None},
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(QueryLimitError)
    async def _query_limit(request: Request, exc: QueryLimitError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "parameter": None}, status_code=400)

    # Stopped at the time limit: the server's doing as much as the query's (a busy machine is
    # slower), so a 503 a client and the dashboard retry after Retry-After, not a 4xx.
    @app.exception_handler(QueryTimeLimitError)
    async def _time_limit(request: Request, exc: QueryTimeLimitError) -> JSONResponse:
        # The refusal is remembered this long (ApiSettings.ctr_refusal_s): asking sooner gets it.
        retry_after_s = max(1, math.ceil(request.app.state.settings.ctr_refusal_s))
        return JSONResponse(
            {"detail": str(exc), "parameter": None},
            status_code=503,
            headers={"Retry-After": str(retry_after_s)},
        )

    @app.exception_handler(ServerLimitError)
    async def _server_limit(request: Request, exc: ServerLimitError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "parameter": None},
            status_code=503,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(LimitsUnavailableError)
    async def _limits_unavailable(request: Request, exc: LimitsUnavailableError) -> JSONResponse:
        _log.warning("limits store unavailable: %s", exc)
        return JSONResponse(
            {"detail": str(exc), "parameter": None},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(SandboxUnavailableError)
    async def _unavailable(request: Request, exc: SandboxUnavailableError) -> JSONResponse:
        _log.warning("SQL sandbox unavailable: %s", exc)
        return JSONResponse(
            {"detail": f"the SQL sandbox is unavailable: {exc}", "parameter": None},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Logged with its traceback by the server; the client gets JSON, not a closed connection.
        # Sent by Starlette's outermost error layer, outside SecurityHeaders: its own headers.
        return JSONResponse(
            {"detail": f"internal error ({type(exc).__name__}); see the server log"},
            status_code=500,
            headers=dict(SECURITY_HEADERS),
        )
