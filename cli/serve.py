"""`ctr serve`: the HTTP API and dashboard under uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from cli.console import console, fail


def serve(
    host: Annotated[
        str | None, typer.Option(help="Bind address (default: API_HOST, 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: API_PORT, 8000).")] = None,
) -> None:
    """Serve /api/v1 (ctr, views, sql), /healthz, /metrics, /docs and the dashboard.

    Needs API_TOKEN (clients send 'Authorization: Bearer <API_TOKEN>'); without it the server
    refuses to start.
    """
    import uvicorn

    from api.main import create_app
    from api.server import server_config
    from api.settings import ApiSettings
    from lake.settings import LakeSettings
    from runtime.kafka_settings import KafkaSettings

    try:
        settings = ApiSettings()  # type: ignore[call-arg]  # API_TOKEN comes from the environment
    except ValidationError as exc:
        if any(error["loc"] == ("token",) for error in exc.errors()):
            message = next(e["msg"] for e in exc.errors() if e["loc"] == ("token",))
            fail(
                "API_TOKEN is not set or unusable "
                f"({message}); the API does not run without a token. Generate one:\n"
                "  export API_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        raise
    host = host or settings.host
    port = port or settings.port
    console.print(f"serving on http://{host}:{port}/ (API docs: http://{host}:{port}/docs)")
    from alerts.settings import AlertSettings

    app = create_app(settings, LakeSettings(), KafkaSettings(), alert_settings=AlertSettings())
    uvicorn.Server(server_config(app, settings, host=host, port=port)).run()
