"""Security headers on every HTTP response: what a browser may load, frame and sniff.

A pure ASGI middleware that adds :data:`SECURITY_HEADERS` to each response's start message, so
answers made outside the routes (the guard's 401 and 413, 404s, static files) carry them too.
A header the response already has is left as it is: a route can set a policy of its own.

The Content-Security-Policy allows scripts, styles and requests to this origin only: the
dashboard (``api/static/``) and ``/docs`` load nothing from elsewhere and run no inline script
(``/docs`` starts Swagger UI from ``static/docs.js``); styles set from scripts (Chart.js sizing
its canvases) are not inline styles in CSP's sense. ``data:`` images are Swagger UI's icons.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY: Final = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ]
)
SECURITY_HEADERS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Opener-Policy": "same-origin",
        "Cross-Origin-Resource-Policy": "same-origin",
    }
)


class SecurityHeaders:
    """Adds ``headers`` (default :data:`SECURITY_HEADERS`) to every HTTP response that does
    not set them itself."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str] = SECURITY_HEADERS) -> None:
        if not headers:
            raise ValueError("'headers' must name at least one header")
        self.app = app
        self.headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {bytes(name).lower() for name, _ in headers}
                missing = [(name, value) for name, value in self.headers if name not in present]
                if missing:
                    message = {**message, "headers": [*headers, *missing]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
