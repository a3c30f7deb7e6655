"""GET /healthz (up or down for anyone; the lake's table versions with the API token) and
GET /metrics (Prometheus text, with API_METRICS_TOKEN or API_TOKEN as a bearer token)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import BearerDep, ServingDep, SettingsDep, authorization
from api.guard import token_ok
from api.models import ErrorResponse, Health

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    response_model_exclude_none=True,
    summary="Liveness: up or down; with the API token, the lake's table versions",
)
async def healthz(serving: ServingDep, settings: SettingsDep, credentials: BearerDep) -> Health:
    if not token_ok(settings.token, authorization(credentials)):
        return Health(status="ok")
    snapshot = await run_in_threadpool(serving.snapshot)
    return Health(status="ok", versions=snapshot.versions())


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics (bearer token: API_METRICS_TOKEN or API_TOKEN)",
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: {"model": ErrorResponse}},
)
async def metrics(request: Request, settings: SettingsDep, credentials: BearerDep) -> Response:
    header = authorization(credentials)
    allowed = token_ok(settings.token, header) or (
        settings.metrics_token is not None and token_ok(settings.metrics_token, header)
    )
    if not allowed:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="/metrics needs a bearer token: API_METRICS_TOKEN (a scrape-only token; "
            "Prometheus: authorization: {credentials: ...}) or API_TOKEN",
            headers={"WWW-Authenticate": "Bearer"},
        )
    body = await run_in_threadpool(generate_latest, request.app.state.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
