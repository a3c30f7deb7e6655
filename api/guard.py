"""Checks every request passes before any route reads its body: the key, then the size.

A pure ASGI middleware, so an unauthenticated request is answered 401 without its body being
read or parsed (FastAPI reads and validates a body before it runs route dependencies), and an
authenticated body over ``max_body_bytes`` gets a 413 without being buffered past that size.
The request's :class:`~access.roles.Access` (who sent it, and what it may read) goes into its
scope's state for the routes (``request.state.access``) and the access log.
"""

from __future__ import annotations

from typing import Final

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.authn import Authenticator

PROTECTED_PREFIX: Final = "/api/"
_CHALLENGE: Final = (b"www-authenticate", b"Bearer")
UNAUTHORIZED: Final = (
    "missing, wrong, revoked or expired key: send 'Authorization: Bearer <key>' "
    "(API_TOKEN or a key from `ctr keys create`)"
)


class RequestGuard:
    """401 for ``/api/`` requests without a live key, 413 for bodies over ``max_body_bytes``;
    the access of any request with a live key in ``scope["state"]["access"]``."""

    def __init__(self, app: ASGIApp, *, authenticator: Authenticator, max_body_bytes: int) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"'max_body_bytes' must be >= 1, got {max_body_bytes}")
        self.app = app
        self.authenticator = authenticator
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        authorization = headers.get(b"authorization")
        access = (
            await self.authenticator.access(authorization.decode("latin-1"))
            if authorization is not None
            else None
        )
        scope.setdefault("state", {})["access"] = access
        if access is None and scope["path"].startswith(PROTECTED_PREFIX):
            await _error(send, 401, UNAUTHORIZED, [_CHALLENGE])
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_body_bytes
            except ValueError:
                await _error(send, 400, "Content-Length is not a number")
                return
            if too_large:
                await _error(send, 413, self._too_large())
                return
            await self.app(scope, receive, send)
            return
        # No declared length (chunked): read up to the limit here, then replay it to the app.
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await _error(send, 413, self._too_large())
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"the request body is larger than API_MAX_BODY_BYTES ({self.max_body_bytes} bytes)"


async def _error(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps({"detail": detail, "parameter": None})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
