"""POST /api/v1/sql: read-only ad-hoc SQL over the registered views, in sandboxed workers;
the answer as JSON or CSV. GET /api/v1/sql/functions: the functions a query may call."""

from __future__ import annotations

import functools
import math
from typing import Annotated, Final

from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Header, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import AccessDep, ClientDep, ServingDep, SettingsDep, SqlPoolDep
from api.errors import ParameterError, ServerLimitError
from api.formats import FormatParam, negotiate, openapi_responses
from api.models import ErrorResponse, SqlFunctionsResponse, SqlRequest, SqlResponse
from api.query_gate import QueryGate
from api.rendering import render_sql
from api.times import as_utc
from api.versions import HEADER as VERSIONS_HEADER
from api.versions import header_value, snapshot_at_least, wanted_versions
from serving_layer.sandbox.database import SqlError, SqlRefusedError, SqlTimeLimitError
from serving_layer.sandbox.functions import ALLOWED_TABLE_FUNCTIONS, FUNCTION_GROUPS
from serving_layer.snapshots import AsOfError

router = APIRouter(prefix="/api/v1", tags=["sql"])

CSV_HEADERS: Final = {
    "Ctr-Truncated": "true when rows were cut off at a limit",
    "Ctr-Truncated-By": "max_rows or max_bytes when truncated",
    "Ctr-Column-Types": "the columns' DuckDB types, comma-separated, each percent-encoded "
    "(RFC 3986, UTF-8) where it has a comma, a percent sign, a control character or a "
    "character outside ASCII: split on commas, then percent-decode each "
    "(DECIMAL(4%2C2) is DECIMAL(4,2))",
    "Ctr-Elapsed-Ms": "the query's time in the worker",
}
_CSV_EXAMPLE: Final = "source,clicks\r\nbatch,1520\r\nspeed,86\r\n"


@router.post(
    "/sql",
    response_model=SqlResponse,
    responses={
        **openapi_responses(_CSV_EXAMPLE, CSV_HEADERS),
        400: {
            "model": ErrorResponse,
            "description": "refused, failed, or over the row, byte or memory limit",
        },
        401: {"model": ErrorResponse},
        413: {"model": ErrorResponse, "description": "body over API_MAX_BODY_BYTES"},
        429: {
            "model": ErrorResponse,
            "description": "every SQL worker busy and the queue full, this key's share of the "
            "workers taken (API_SQL_WORKERS_PER_KEY), or this key backed off (recent queries "
            "of its were stopped at the time limit, crashed their worker or ran out of "
            "memory); with API_LIMITS_URL the share and the back-off count across the API's "
            "replicas: retry after Retry-After seconds",
        },
        503: {
            "model": ErrorResponse,
            "description": "stopped at the time limit (API_SQL_TIMEOUT_S), the sandbox could "
            "not be set up, or the limits store the replicas share (API_LIMITS_URL) did not "
            "answer: retry after Retry-After seconds",
        },
    },
    summary="Read-only SQL over the views the key may read (SHOW TABLES lists them)",
)
async def post_sql(
    request: Request,
    body: SqlRequest,
    serving: ServingDep,
    settings: SettingsDep,
    pool: SqlPoolDep,
    client: ClientDep,
    access: AccessDep,
    format: FormatParam = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    output = negotiate(format, accept)
    if body.max_rows is not None and body.max_rows > settings.sql_max_rows:
        raise ParameterError("max_rows", f"at most {settings.sql_max_rows}, got {body.max_rows}")
    if body.as_of is None:
        # Not older than the versions the client has seen (its Ctr-Versions header).
        seen = wanted_versions(request)
        snapshot = await run_in_threadpool(snapshot_at_least, serving.reader.snapshots, seen)
    else:
        as_of = as_utc(body.as_of, "as_of")
        try:
            snapshot = await run_in_threadpool(serving.reader.snapshots.at, as_of)
        except AsOfError as exc:
            raise ParameterError("as_of", str(exc)) from None
    run = functools.partial(
        pool.run,
        body.sql,
        snapshot,
        max_rows=body.max_rows or settings.sql_max_rows,
        max_bytes=int(settings.sql_max_bytes),
        timeout_s=settings.sql_timeout_s,
        # Whom a query that costs its worker backs off.
        client=client,
        # The tables and rows the key may read: an advertiser's database holds no other row.
        access=access,
    )
    # A backed-off key is refused before it queues; then a place among the key's share of the
    # workers (one key never holds them all, nor fills the queue), then a worker.
    # (On a thread: with replicas, the back-off is kept in their shared store.)
    await run_in_threadpool(pool.check_backoff, client)
    gate: QueryGate = request.app.state.sql_gate
    try:
        async with gate.place(client):
            # Threads of its own: queries waiting for a worker never hold the threads that
            # /api/v1/ctr and /healthz need.
            limiter: CapacityLimiter = request.app.state.sql_limiter
            result = await to_thread.run_sync(run, limiter=limiter)
    except SqlRefusedError as exc:
        raise ParameterError("sql", f"refused: {exc}") from None
    except SqlTimeLimitError as exc:
        raise ServerLimitError(f"sql: {exc}", math.ceil(exc.retry_after_s)) from None
    except SqlError as exc:
        raise ParameterError("sql", f"query failed: {exc}") from None
    response = render_sql(result, output).response()
    response.headers[VERSIONS_HEADER] = header_value(snapshot)
    return response


@router.get(
    "/sql/functions",
    response_model=SqlFunctionsResponse,
    responses={401: {"model": ErrorResponse}},
    summary="The functions a query of POST /api/v1/sql may call (the others are refused)",
)
async def get_sql_functions() -> SqlFunctionsResponse:
    return SqlFunctionsResponse(
        table_functions=sorted(ALLOWED_TABLE_FUNCTIONS),
        functions={kind: sorted(names) for kind, names in FUNCTION_GROUPS.items()},
    )
