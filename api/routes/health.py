"""GET /healthz and GET /metrics (Prometheus text); no token needed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import ServingDep
from api.models import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="Liveness: the lake's table versions")
def healthz(serving: ServingDep) -> Health:
    return Health(status="ok", versions=serving.snapshot().versions())


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
