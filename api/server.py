"""The API under uvicorn with the edge's limits: one place that builds the server, for
``ctr serve``, the tests and the benchmarks alike."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from api import metric_catalog as catalog
from api.edge import EdgeLimits, EdgeState, edge_protocol
from api.settings import ApiSettings


def edge_limits(settings: ApiSettings) -> EdgeLimits:
    return EdgeLimits(
        max_head_bytes=int(settings.max_header_bytes),
        max_headers=settings.max_headers,
        max_request_line_bytes=int(settings.max_request_line_bytes),
        head_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
        max_connections_per_client=settings.max_connections_per_client,
        trusted_proxies=settings.trusted_proxy_networks,
    )


def server_config(
    app: FastAPI,
    settings: ApiSettings,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str = "warning",
) -> uvicorn.Config:
    """uvicorn's configuration for ``app``: the edge protocol with ``settings``' limits (its
    refusals counted in ``app``'s /metrics), keep-alive, no server header; X-Forwarded-For
    believed from ``API_TRUSTED_PROXIES`` only (uvicorn's own default believes any local peer,
    and ``FORWARDED_ALLOW_IPS`` from the environment would widen it unseen)."""
    if settings.access_log:
        log_access_to_stderr()
    edge = EdgeState(edge_limits(settings))
    registry = getattr(app.state, "registry", None)
    if registry is not None:
        registry.register(EdgeCollector(edge))
    return uvicorn.Config(
        app,
        host=host or settings.host,
        port=port or settings.port,
        http=edge_protocol(edge),
        timeout_keep_alive=int(max(1, round(settings.keep_alive_s))),
        server_header=False,
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=settings.trusted_proxies.split(",") if settings.trusted_proxies else [],
        log_level=log_level,
    )


def log_access_to_stderr() -> None:
    """The access log's lines (logger ``ctr.access``) on stderr, once per process."""
    log = logging.getLogger("ctr.access")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s access %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class EdgeCollector(Collector):
    """``ctr_api_edge_refused_total{reason}`` and ``ctr_api_open_connections``."""

    def __init__(self, edge: EdgeState) -> None:
        self._edge = edge

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        refused = catalog.EDGE_REFUSED.family()
        for reason, count in sorted(self._edge.refused.copy().items()):
            refused.add_metric([reason], count)
        yield refused
        yield catalog.OPEN_CONNECTIONS.family(self._edge.open_connections)
