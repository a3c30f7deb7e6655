"""GET /docs: Swagger UI from the files vendored under api/static/vendor/swagger-ui/ (no CDN).

FastAPI's own page loads Swagger UI from a CDN and starts it with an inline script, which the
API's Content-Security-Policy (``script-src 'self'``) blocks; this page starts it from
``static/docs.js``, which reads the OpenAPI document's URL from the page. No ReDoc: its bundle
needs inline styles and ``blob:`` workers.
"""

from __future__ import annotations

from html import escape
from typing import Final

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from api.routes.dashboard import STATIC_DIR

SWAGGER_UI: Final = STATIC_DIR / "vendor" / "swagger-ui"
_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="stylesheet" href="{static}/vendor/swagger-ui/swagger-ui.css">
  <link rel="icon" type="image/png" href="{static}/vendor/swagger-ui/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui" data-openapi-url="{openapi_url}"></div>
  <script src="{static}/vendor/swagger-ui/swagger-ui-bundle.js"></script>
  <script src="{static}/docs.js"></script>
</body>
</html>
"""

router = APIRouter(include_in_schema=False)


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    if request.app.openapi_url is None or not (SWAGGER_UI / "swagger-ui-bundle.js").is_file():
        raise HTTPException(404, "no Swagger UI in api/static/vendor/ (make dashboard)")
    root = request.scope.get("root_path", "").rstrip("/")
    page = _PAGE.format(
        title=escape(f"{request.app.title} - Swagger UI"),
        static=escape(f"{root}/static"),
        openapi_url=escape(f"{root}{request.app.openapi_url}"),
    )
    return HTMLResponse(page)
