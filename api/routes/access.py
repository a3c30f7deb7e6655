"""GET /api/v1/access: who the key belongs to and what it may read (the dashboard shows it)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import AccessDep
from api.models import AccessResponse, ErrorResponse

router = APIRouter(prefix="/api/v1", tags=["access"])


@router.get(
    "/access",
    response_model=AccessResponse,
    responses={401: {"model": ErrorResponse}},
    summary="The key's name, scope and what it may read",
)
async def get_access(access: AccessDep) -> AccessResponse:
    scope = access.scope
    return AccessResponse(
        name=access.name,
        scope=access.role,
        campaigns=list(scope.campaigns) if scope is not None else None,
        ads=list(scope.ads) if scope is not None and scope.ads else None,
        raw_tables=access.raw_tables,
        metrics=access.role == "admin",
    )
