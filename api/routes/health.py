"""GET /healthz (up or down for anyone; the lake's table versions with an admin or analyst
key), GET /readyz (whether this replica has read the lake and can answer: a load balancer's
check) and GET /metrics (Prometheus text, with API_METRICS_TOKEN or an admin key)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.authn import token_ok
from api.deps import BearerDep, OptionalAccessDep, ServingDep, SettingsDep, authorization
from api.models import ErrorResponse, Health, Readiness

router = APIRouter(tags=["operations"])
_log = logging.getLogger(__name__)


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
    "/readyz",
    response_model=Readiness,
    response_model_exclude_none=True,
    summary="Readiness: 200 once this replica has read the lake's snapshot, else 503",
    responses={503: {"model": Readiness, "description": "the lake has not been read yet"}},
)
async def readyz(request: Request, serving: ServingDep) -> Readiness | JSONResponse:
    """Ready from the first snapshot this process reads on (a check reads it if no request
    did, so the balancer's first checks warm a new replica). Once ready it stays so without I/O:
    a balancer's checks every few seconds list no Delta log, and a lake that becomes
    unreadable later fails every replica alike, which taking one out would not mend."""
    if not getattr(request.app.state, "lake_read", False):
        try:
            await run_in_threadpool(serving.reader.snapshot)
        except Exception as exc:
            _log.warning("readyz: the lake's snapshot could not be read: %s", exc)
            not_ready = Readiness(
                status="not ready", detail="this replica has not read the lake's snapshot yet"
            )
            return JSONResponse(not_ready.model_dump(), status_code=503)
        request.app.state.lake_read = True
    return Readiness(status="ready")


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics (bearer token: API_METRICS_TOKEN or an admin key)",
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {}},
            "description": "Prometheus' text format: requests, latency, the lake, the caches, "
            "the SQL pool, the edge (Querying: Metrics)",
        },
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
