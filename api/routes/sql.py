"""POST /api/v1/sql: read-only ad-hoc SQL over the registered views, sandboxed."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ServingDep, SettingsDep
from api.errors import ParameterError
from api.models import ErrorResponse, SqlRequest, SqlResponse
from api.rendering import jsonable
from serving_layer import SqlError, SqlRefusedError, run_sql

router = APIRouter(prefix="/api/v1", tags=["sql"])


@router.post(
    "/sql",
    response_model=SqlResponse,
    responses={400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}},
    summary="Read-only SQL over events, rejected, ctr_batch, ctr_speed, coverage, covered, ctr",
)
def post_sql(body: SqlRequest, serving: ServingDep, settings: SettingsDep) -> SqlResponse:
    if body.max_rows is not None and body.max_rows > settings.sql_max_rows:
        raise ParameterError("max_rows", f"at most {settings.sql_max_rows}, got {body.max_rows}")
    try:
        result = run_sql(
            body.sql,
            serving.snapshot(),
            max_rows=body.max_rows or settings.sql_max_rows,
            timeout_s=settings.sql_timeout_s,
            memory_limit=settings.sql_memory_limit,
        )
    except SqlRefusedError as exc:
        raise ParameterError("sql", f"refused: {exc}") from None
    except SqlError as exc:
        raise ParameterError("sql", f"query failed: {exc}") from None
    return SqlResponse(
        columns=result.columns,
        types=result.types,
        rows=[[jsonable(v) for v in row] for row in result.rows],
        truncated=result.truncated,
        elapsed_ms=round(result.elapsed_s * 1000, 3),
    )
