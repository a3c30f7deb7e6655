"""Dependencies for route signatures: settings, the serving layer, the token check.

All ``async``: they never block, and FastAPI runs a plain ``def`` dependency in its thread pool,
a thread hop per dependency per request."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.response_cache import ResponseCache
from api.settings import ApiSettings
from serving_layer import ServingLayer

_bearer = HTTPBearer(auto_error=False, description="API_TOKEN of the server")


async def get_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


async def get_serving(request: Request) -> ServingLayer:
    serving: ServingLayer = request.app.state.serving
    return serving


async def get_cache(request: Request) -> ResponseCache:
    cache: ResponseCache = request.app.state.cache
    return cache


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
ServingDep = Annotated[ServingLayer, Depends(get_serving)]
CacheDep = Annotated[ResponseCache, Depends(get_cache)]


async def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless ``Authorization: Bearer <API_TOKEN>``."""
    expected = settings.token.get_secret_value().encode()
    if credentials is None or not secrets.compare_digest(
        credentials.credentials.encode(), expected
    ):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token: send 'Authorization: Bearer <API_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
