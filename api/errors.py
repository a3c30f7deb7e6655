"""Error responses: every 4xx says what is wrong and, for bad input, which parameter."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class ParameterError(Exception):
    """A request parameter is invalid: 400 naming it."""

    def __init__(self, parameter: str | None, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


def install(app: FastAPI) -> None:
    @app.exception_handler(ParameterError)
    async def _parameter(request: Request, exc: ParameterError) -> JSONResponse:
        detail = f"{exc.parameter}: {exc.message}" if exc.parameter else exc.message
        return JSONResponse({"detail": detail, "parameter": exc.parameter}, status_code=400)

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
