"""The FastAPI application: routers, error handlers, metrics, the dashboard's static files."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from anyio import CapacityLimiter
from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry

from access.key_watcher import KeyWatcher
from alerts.settings import AlertSettings
from api import error_responses
from api.authn import Authenticator, utc_now
from api.deps import require_access
from api.errors import ParameterError
from api.guard import RequestGuard
from api.limits import LimitsStore, check_limits, open_limits, sql_longest_s
from api.metrics import LakeCollector, RequestMetrics
from api.pg_wire import PgWire, PgWireCollector
from api.query_gate import QueryGate
from api.rendering import Rendered
from api.response_cache import ResponseCache
from api.routes import access, alerts, ctr, dashboard, docs, health, sql, views
from api.security_headers import SecurityHeaders
from api.settings import ApiSettings
from api.topic_depth import TopicDepth
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from serving_layer.reader import QueryLimitError, SnapshotReader
from serving_layer.sandbox.backoff import ClientBackoff
from serving_layer.sandbox.pool import SqlPool
from serving_layer.service import ServingLayer


async def _start_pg_wire(
    app: FastAPI, settings: ApiSettings, authenticator: Authenticator
) -> PgWire | None:
    """The views over PostgreSQL's protocol (API_PG_PORT; None: off), by this process's key
    check, SQL pool and gate."""
    if settings.pg_port is None:
        return None
    wire = PgWire(
        settings,
        authenticator=authenticator,
        serving=app.state.serving,
        pool=app.state.sql_pool,
        gate=app.state.sql_gate,
        limiter=app.state.sql_limiter,
        store=app.state.lake.object_store,
    )
    await wire.start()
    app.state.registry.register(PgWireCollector(wire))
    return wire


def create_app(
    settings: ApiSettings,
    lake: LakeSettings,
    kafka: KafkaSettings,
    *,
    alert_settings: AlertSettings,
    key_clock: Callable[[], dt.datetime] = utc_now,
    clock: Callable[[], float] = time.monotonic,
    limits: LimitsStore | None = None,
) -> FastAPI:
    """The API over ``lake``; ``kafka`` is only asked for the dead-letter topic's depth;
    ``alert_settings`` are what new alert rules are checked against (where webhooks may point,
    rules per key);
    ``key_clock`` (default: the system's UTC time) is what keys' expiry is checked against;
    ``clock`` (seconds, monotonic) times the SQL back-off, the response cache and the
    dead-letter depth's refresh (tests pass clocks they move); ``limits`` is where the limits
    every replica must respect are counted (default: ``API_LIMITS_URL``'s store, else this
    process; one given is the caller's to close). The entry point (``ctr serve``) builds the
    settings from the environment."""
    store = limits if limits is not None else open_limits(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await check_limits(store)
        app.state.serving = ServingLayer(
            SnapshotReader(
                lake,
                refresh_s=settings.refresh_s,
                seldom_s=settings.refresh_seldom_s,
                max_stale_s=settings.cache_stale_s,
                timeout_s=settings.ctr_timeout_s,
                memory_limit_bytes=int(settings.ctr_memory_limit),
            ),
            reach_max_values=settings.ctr_reach_max_values,
        )
        # Each new snapshot (the speed layer commits every second): the answers being read
        # are recomputed at once, so a polling dashboard's next request gets the new one.
        app.state.serving.reader.snapshots.subscribe(
            lambda snapshot: app.state.cache.refresh_ahead(snapshot.key, snapshot)
        )
        # Places per key: one key's heavy queries leave places for the others.
        app.state.ctr_gate = QueryGate(
            workers=settings.ctr_workers,
            per_client=settings.ctr_per_key,
            queue=settings.ctr_queue,
            queue_timeout_s=settings.ctr_queue_timeout_s,
            what="CTR queries",
            shares=store.shares("ctr", longest_s=settings.ctr_timeout_s),
        )
        app.state.sql_gate = QueryGate(
            workers=settings.sql_workers,
            per_client=settings.sql_per_key,
            queue=settings.sql_queue,
            queue_timeout_s=settings.sql_queue_timeout_s,
            what="SQL queries",
            setting="API_SQL",
            shares=store.shares("sql", longest_s=sql_longest_s(settings)),
        )
        # Answers are computed on threads of their own, as many as may run at once.
        app.state.ctr_limiter = CapacityLimiter(settings.ctr_workers)
        # Workers start on the first query; SQL waits on threads of its own (see routes/sql).
        app.state.sql_pool = SqlPool(
            workers=settings.sql_workers,
            queue_size=settings.sql_queue,
            queue_timeout_s=settings.sql_queue_timeout_s,
            memory_bytes=int(settings.sql_memory_limit),
            backoffs=store.backoffs(
                ClientBackoff(
                    first_s=min(settings.sql_backoff_s, settings.sql_max_backoff_s),
                    max_s=settings.sql_max_backoff_s,
                    forgive_s=settings.sql_forgive_s,
                ),
                clock,
            ),
        )
        app.state.sql_limiter = CapacityLimiter(settings.sql_workers + settings.sql_queue + 4)
        authenticator.usage = store.key_uses(lake, settings.key_use_flush_s)
        app.state.pg_wire = await _start_pg_wire(app, settings, authenticator)
        try:
            yield
        finally:
            if app.state.pg_wire is not None:
                await app.state.pg_wire.close()
            authenticator.usage.close()
            authenticator.usage = None
            app.state.cache.close()
            app.state.sql_pool.close()
            app.state.serving.close()
            if limits is None:
                store.close()

    app = FastAPI(
        title="ctr-lambda",
        summary="Ad click-through rates: exact batch views merged with fresh speed views.",
        version="0.1.0",
        lifespan=lifespan,
        # /docs is served from the vendored Swagger UI (api/routes/docs.py); no ReDoc.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    # The lake's own tables the routes read and append to directly (alerts/rules, alerts/events).
    app.state.lake = lake
    app.state.alert_settings = alert_settings
    # API_TOKEN (the bootstrap admin) and the keys of the lake's key store (`ctr keys`).
    keys = KeyWatcher(lake, check_every_s=settings.keys_check_s)
    authenticator = Authenticator(settings.token, keys, clock=key_clock)
    app.state.authenticator = authenticator
    app.state.cache = ResponseCache[Rendered](
        settings.cache_entries,
        max_bytes=int(settings.cache_max_bytes),
        max_stale_s=settings.cache_stale_s,
        # Over the byte cap, the time limit or the memory limit: asking again costs nothing.
        refusal_s=settings.ctr_refusal_s,
        refused=lambda error: isinstance(error, ParameterError | QueryLimitError),
        clock=clock,
    )
    registry = CollectorRegistry()
    dead_letters = TopicDepth(
        kafka,
        kafka.dlq_topic,
        timeout_s=settings.kafka_timeout_s,
        refresh_s=settings.dlq_refresh_s,
        clock=clock,
    )
    registry.register(
        LakeCollector(
            lambda: app.state.serving,
            lambda: app.state.cache,
            dead_letters,
            lambda: app.state.sql_pool,
            lambda: app.state.ctr_gate,
            sql_gate=lambda: app.state.sql_gate,
            key_checks=lambda: keys.checks,
        )
    )
    app.state.registry = registry
    error_responses.install(app)
    protected = [Depends(require_access)]
    for router in (ctr.router, views.router, sql.router, access.router, alerts.router):
        app.include_router(router, dependencies=protected)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.include_router(docs.router)
    if dashboard.STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    app.add_middleware(
        RequestGuard, authenticator=authenticator, max_body_bytes=int(settings.max_body_bytes)
    )
    app.add_middleware(RequestMetrics, registry=registry, access_log=settings.access_log)
    # Outermost: every answer the app sends, the guard's and the metrics' included.
    app.add_middleware(SecurityHeaders)
    return app
