"""GET /healthz (up or down for anyone; the lake's table versions with an admin or analyst
key) and GET /metrics (Prometheus text, with API_METRICS_TOKEN or an admin key)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.authn import token_ok
from api.deps import BearerDep, OptionalAccessDep, ServingDep, SettingsDep, authorization
from api.models import ErrorResponse, Health

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    response_model_exclude_none=True,
    summary="Liveness: up or down; with an admin or analyst key, the lake's table versions",
)
async def healthz(serving: ServingDep, access: OptionalAccessDep) -> Health:
    if access is None or not access.sees_everything:
        return Health(status="ok")
    snapshot = await run_in_threadpool(serving.reader.snapshot)
    return Health(status="ok", versions=snapshot.versions())


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics (bearer token: API_METRICS_TOKEN or an admin key)",
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}},
        401: {"model": ErrorResponse},
        403: {"model": ErrorResponse, "description": "a key that is not an admin's"},
    },
)
async def metrics(
    request: Request, settings: SettingsDep, credentials: BearerDep, access: OptionalAccessDep
) -> Response:
    scraper = settings.metrics_token is not None and token_ok(
        settings.metrics_token, authorization(credentials)
    )
    if not scraper:
        if access is None:
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="/metrics needs a bearer token: API_METRICS_TOKEN (a scrape-only token; "
                "Prometheus: authorization: {credentials: ...}), API_TOKEN or an admin key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if access.role != "admin":
            raise HTTPException(
                status_code=status.HTTP_403_FORBIDDEN,
                detail=f"/metrics is for admin keys (and API_METRICS_TOKEN); {access.name!r} is "
                f"an {access.role} key",
            )
    body = await run_in_threadpool(generate_latest, request.app.state.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
