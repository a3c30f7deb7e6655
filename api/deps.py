"""Dependencies for route signatures: settings, the serving layer, the SQL pool, the caller's
access.

All ``async``: they never block, and FastAPI runs a plain ``def`` dependency in its thread pool,
a thread hop per dependency per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from access.roles import Access
from alerts.settings import AlertSettings
from api.guard import UNAUTHORIZED
from api.rendering import Rendered
from api.response_cache import ResponseCache
from api.settings import ApiSettings
from lake.settings import LakeSettings
from serving_layer.sandbox.pool import SqlPool
from serving_layer.service import ServingLayer

_bearer = HTTPBearer(
    auto_error=False,
    description="an API key (`ctr keys create`) or the server's API_TOKEN (/metrics also "
    "takes API_METRICS_TOKEN)",
)


async def get_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


async def get_alert_settings(request: Request) -> AlertSettings:
    alerts: AlertSettings = request.app.state.alert_settings
    return alerts


async def get_lake(request: Request) -> LakeSettings:
    lake: LakeSettings = request.app.state.lake
    return lake


async def get_serving(request: Request) -> ServingLayer:
    serving: ServingLayer = request.app.state.serving
    return serving


async def get_cache(request: Request) -> ResponseCache[Rendered]:
    cache: ResponseCache[Rendered] = request.app.state.cache
    return cache


async def get_sql_pool(request: Request) -> SqlPool:
    pool: SqlPool = request.app.state.sql_pool
    return pool


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
ServingDep = Annotated[ServingLayer, Depends(get_serving)]
CacheDep = Annotated[ResponseCache[Rendered], Depends(get_cache)]
SqlPoolDep = Annotated[SqlPool, Depends(get_sql_pool)]
LakeDep = Annotated[LakeSettings, Depends(get_lake)]
AlertSettingsDep = Annotated[AlertSettings, Depends(get_alert_settings)]
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_client(request: Request) -> str:
    """Whom per-client limits count (the CTR and SQL gates' shares, the SQL back-off): the key
    a request carries (by name: two keys on one address are two clients, one key on many
    addresses one), else the client's address: the peer's, or behind a trusted proxy
    (``API_TRUSTED_PROXIES``) the one it forwarded for."""
    access: Access | None = getattr(request.state, "access", None)
    if access is not None:
        return f"key:{access.name}"
    return f"address:{request.client.host if request.client is not None else 'unknown'}"


ClientDep = Annotated[str, Depends(get_client)]


def authorization(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The ``Authorization`` header value the bearer credentials came from."""
    return f"Bearer {credentials.credentials}" if credentials is not None else None


async def get_optional_access(request: Request, _: BearerDep) -> Access | None:
    """Who sent the request, if it carries a live key (:class:`api.guard.RequestGuard` checks
    it before the body is read)."""
    access: Access | None = getattr(request.state, "access", None)
    return access


async def require_access(access: Annotated[Access | None, Depends(get_optional_access)]) -> Access:
    """401 unless the request carries a live key (this declares it in the OpenAPI
    document)."""
    if access is None:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=UNAUTHORIZED,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return access


AccessDep = Annotated[Access, Depends(require_access)]
OptionalAccessDep = Annotated[Access | None, Depends(get_optional_access)]
