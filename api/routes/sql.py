"""POST /api/v1/sql: read-only ad-hoc SQL over the registered views, in sandboxed workers."""

from __future__ import annotations

import datetime as dt
import functools

import orjson
from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import ServingDep, SettingsDep, SqlPoolDep
from api.errors import ParameterError
from api.models import ErrorResponse, SqlRequest, SqlResponse
from serving_layer.sandbox import SqlError, SqlRefusedError
from serving_layer.tables import AsOfError

router = APIRouter(prefix="/api/v1", tags=["sql"])


@router.post(
    "/sql",
    response_model=SqlResponse,
    responses={
        400: {"model": ErrorResponse, "description": "refused, failed, or over a limit"},
        401: {"model": ErrorResponse},
        413: {"model": ErrorResponse, "description": "body over API_MAX_BODY_BYTES"},
        429: {"model": ErrorResponse, "description": "every SQL worker busy, queue full"},
        503: {"model": ErrorResponse, "description": "the sandbox could not be set up"},
    },
    summary="Read-only SQL over events, rejected, ctr_batch, ctr_speed, coverage, covered, ctr",
)
async def post_sql(
    request: Request,
    body: SqlRequest,
    serving: ServingDep,
    settings: SettingsDep,
    pool: SqlPoolDep,
) -> Response:
    if body.max_rows is not None and body.max_rows > settings.sql_max_rows:
        raise ParameterError("max_rows", f"at most {settings.sql_max_rows}, got {body.max_rows}")
    if body.as_of is None:
        snapshot = await run_in_threadpool(serving.snapshot)
    else:
        as_of = body.as_of if body.as_of.tzinfo is not None else body.as_of.replace(tzinfo=dt.UTC)
        try:
            snapshot = await run_in_threadpool(serving.snapshots.at, as_of)
        except AsOfError as exc:
            raise ParameterError("as_of", str(exc)) from None
    run = functools.partial(
        pool.run,
        body.sql,
        snapshot,
        max_rows=body.max_rows or settings.sql_max_rows,
        max_bytes=int(settings.sql_max_bytes),
        timeout_s=settings.sql_timeout_s,
    )
    try:
        # Threads of its own: queries waiting for a worker never hold the threads that
        # /api/v1/ctr and /healthz need.
        limiter: CapacityLimiter = request.app.state.sql_limiter
        result = await to_thread.run_sync(run, limiter=limiter)
    except SqlRefusedError as exc:
        raise ParameterError("sql", f"refused: {exc}") from None
    except SqlError as exc:
        raise ParameterError("sql", f"query failed: {exc}") from None
    return Response(
        orjson.dumps(
            {
                "columns": result.columns,
                "types": result.types,
                "rows": result.rows,
                "truncated": result.truncated,
                "truncated_by": result.truncated_by,
                "elapsed_ms": round(result.elapsed_s * 1000, 3),
            }
        ),
        media_type="application/json",
    )
