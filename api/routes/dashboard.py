"""GET /: the dashboard page (static files under api/static/, built separately); no token —
the page asks for it, or reads it from the URL fragment (#token=…), which never reaches the
server."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
def index() -> FileResponse:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        raise HTTPException(404, "no dashboard in api/static/; the API is documented at /docs")
    return FileResponse(page)
