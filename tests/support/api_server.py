"""The real API (``api.main.create_app``) under uvicorn on a free loopback port (test support)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI
from uvicorn._compat import asyncio_run

from alerts.settings import AlertSettings
from api.authn import utc_now
from api.main import create_app
from api.server import server_config
from api.settings import ApiSettings
from infra.broker import free_port
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from tests.support.waiting import wait_until


@contextlib.contextmanager
def running_api(
    settings: ApiSettings,
    lake: LakeSettings,
    kafka: KafkaSettings | None = None,
    *,
    key_clock: Callable[[], dt.datetime] = utc_now,
    alert_settings: AlertSettings | None = None,
) -> Iterator[str]:
    """Serve the API over ``lake`` in a thread; yields its base URL, stops it afterwards.
    New alert rules are checked against ``alert_settings`` (default: none allowed past
    public webhook addresses)."""
    app = create_app(
        settings,
        lake,
        kafka or KafkaSettings(),
        key_clock=key_clock,
        alert_settings=alert_settings or AlertSettings(),
    )
    with running_app(app, settings) as url:
        yield url


@contextlib.contextmanager
def running_app(app: FastAPI, settings: ApiSettings) -> Iterator[str]:
    """Serve ``app`` (made by ``create_app``, with a clock of the test's, say) in a thread;
    yields its base URL, stops it afterwards. Its state (``app.state.sql_pool``) is the test's
    to look at once the server has started, and ``app.state.server_loop`` is the event loop
    it serves on (for a test that acts on the gates, which live there)."""
    server = uvicorn.Server(server_config(app, settings, host="127.0.0.1", port=free_port()))

    async def serve() -> None:
        app.state.server_loop = asyncio.get_running_loop()
        await server.serve()

    def run() -> None:
        asyncio_run(serve(), loop_factory=server.config.get_loop_factory())

    thread = threading.Thread(target=run, name="test-api", daemon=True)
    thread.start()
    wait_until(
        lambda: server.started or not thread.is_alive(),
        timeout_s=120,
        what="the API server started",
    )
    if not server.started:
        raise RuntimeError("the API server did not start (see the captured log)")
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
