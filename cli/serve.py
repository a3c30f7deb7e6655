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
    pg_port: Annotated[
        int | None,
        typer.Option(
            help="Port of the PostgreSQL endpoint, the views for psql and BI tools with the key "
            "as password (default: API_PG_PORT; unset: off)."
        ),
    ] = None,
) -> None:
    """Serve /api/v1 (ctr, views, sql), /healthz, /metrics, /docs and the dashboard; with
    --pg-port (API_PG_PORT) the SQL views over PostgreSQL's protocol too.

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
    if pg_port is not None:
        settings = settings.model_copy(update={"pg_port": pg_port})
    console.print(f"serving on http://{host}:{port}/ (API docs: http://{host}:{port}/docs)")
    if settings.pg_port is not None:
        pg_host = settings.pg_host or host
        console.print(
            f"PostgreSQL endpoint on {pg_host}:{settings.pg_port} "
            f'(psql "host={pg_host} port={settings.pg_port} user=ctr dbname=ctr", the key as '
            "password)"
        )
    from alerts.settings import AlertSettings

    app = create_app(settings, LakeSettings(), KafkaSettings(), alert_settings=AlertSettings())
    uvicorn.Server(server_config(app, settings, host=host, port=port)).run()
