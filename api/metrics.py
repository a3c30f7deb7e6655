"""Prometheus metrics: requests (count, latency) per route, and the lake's state per scrape."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from access.roles import Access
from api import metric_catalog as catalog
from api.query_gate import QueryGate
from api.response_cache import ResponseCache
from api.topic_depth import TopicDepth
from serving_layer.inventory import Inventory
from serving_layer.sandbox.pool import SqlPool
from serving_layer.service import ServingLayer
from serving_layer.snapshots import LakeSnapshot

_log = logging.getLogger(__name__)
# Who asked for what (RequestMetrics): `ctr serve` writes it to stderr.
_access_log = logging.getLogger("ctr.access")
_UNLOGGED = ("/static/", "/readyz")
_UNPRINTABLE = re.compile(r"[^A-Za-z0-9/._~%:@!$&'()*+,;=-]")
Metric = GaugeMetricFamily | CounterMetricFamily
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RequestMetrics:
    """Pure ASGI middleware (cheaper than BaseHTTPMiddleware) counting requests per route
    template, so ``/api/v1/ctr?…`` is one series whatever its parameters."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log
        self.requests = catalog.REQUESTS.counter(registry)
        self.latency = catalog.REQUEST_SECONDS.histogram(registry, _BUCKETS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = "500"

        async def record_status(message: Message) -> None:
            # What was sent, once it was: a head the server could not write (an invalid header
            # value, a closed connection) counts as "dropped", not as the status it named.
            nonlocal status
            try:
                await send(message)
            except BaseException:
                status = "dropped"
                raise
            if message["type"] == "http.response.start":
                status = str(message["status"])

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            elapsed = time.perf_counter() - started
            self.requests.labels(scope["method"], route, status).inc()
            self.latency.labels(route).observe(elapsed)
            # Not the static files, nor the balancers' readiness checks (one a second each).
            if self.access_log and not scope["path"].startswith(_UNLOGGED):
                access: Access | None = scope.get("state", {}).get("access")
                # The peer, or behind a trusted proxy the client it forwarded for.
                client = scope.get("client")
                _access_log.info(
                    "key=%s role=%s %s %s status=%s ms=%.1f client=%s",
                    access.name if access is not None else "-",
                    access.role if access is not None else "-",
                    scope["method"],
                    route if route != "unmatched" else _printable(scope["path"]),
                    status,
                    elapsed * 1000,
                    _printable(client[0]) if client else "-",
                )


def _printable(path: str) -> str:
    """A path not matched to a route (refused before routing: 401, 413), for the log: no
    character that could forge a line, at most 120 of them."""
    return _UNPRINTABLE.sub("?", path[:120])


class LakeCollector(Collector):
    """Table versions and rows, freshness, speed-job status, quarantined and dead-lettered
    records, the SQL workers, read per scrape (lake values are computed once per table
    version). A part that fails (an unreadable table) is left out and counted in
    ``ctr_metrics_errors``; the rest is still served."""

    def __init__(
        self,
        serving: Callable[[], ServingLayer],
        cache: Callable[[], ResponseCache[Any]],
        dead_letters: TopicDepth | None = None,
        sql_pool: Callable[[], SqlPool] | None = None,
        ctr_gate: Callable[[], QueryGate] | None = None,
        *,
        sql_gate: Callable[[], QueryGate] | None = None,
        key_checks: Callable[[], int] | None = None,
    ):
        self._serving = serving
        self._cache = cache
        self._dead_letters = dead_letters
        self._sql_pool = sql_pool
        self._ctr_gate = ctr_gate
        self._sql_gate = sql_gate
        self._key_checks = key_checks

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        errors = catalog.ERRORS.family()
        serving = self._serving()
        snap: LakeSnapshot | None = None
        try:
            snap = serving.reader.snapshot()
        except Exception as exc:
            _log.warning("metrics: reading the lake failed: %s", exc)
            errors.add_metric(["lake"], 1)
        parts: list[tuple[str, Callable[[], Iterator[Metric]]]] = []
        if snap is not None:
            lake, inventory = snap, Inventory(serving.reader)
            parts += [
                ("tables", lambda: self._tables(inventory, lake)),
                ("freshness", lambda: self._freshness(serving, lake)),
                ("rejected", lambda: self._rejected(inventory, lake)),
                ("stale", lambda: self._stale(inventory, lake)),
                ("drift", lambda: self._drift(inventory, lake)),
            ]
        parts += [("dead_letters", self._dlq), ("cache", self._cache_counts)]
        parts.append(("object_store", lambda: object_store_requests(serving, self._key_checks)))
        if self._sql_pool is not None:
            parts.append(("sql", self._sql))
        if self._ctr_gate is not None:
            parts.append(("ctr_gate", self._gate))
        for part, produce in parts:
            try:
                # Materialised first, so a part either appears whole or not at all.
                yield from list(produce())
            except Exception as exc:
                _log.warning("metrics: %s failed: %s", part, exc)
                errors.add_metric([part], 1)
        yield errors

    def _tables(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        versions = catalog.TABLE_VERSION.family()
        for name, version in snap.versions().items():
            versions.add_metric([name], -1 if version is None else version)
        yield versions
        rows = catalog.TABLE_ROWS.family()
        for name in snap.tables:
            rows.add_metric([name], inventory.table_info(snap[name]).rows)
        yield rows

    def _freshness(self, serving: ServingLayer, snap: LakeSnapshot) -> Iterator[Metric]:
        fresh = serving.freshness(snap)
        for spec, value in (
            (catalog.LATEST_COVERED, fresh.latest_covered_bucket),
            (catalog.LATEST_SPEED, fresh.latest_speed_bucket),
            (catalog.SPEED_UPDATED, fresh.speed_updated_at),
            (catalog.SPEED_WATERMARK, fresh.speed_watermark),
        ):
            if value is not None:
                yield spec.family(value.timestamp())
        status = snap.status
        if status is not None:
            for spec, number, scale in (
                (catalog.SPEED_LAG, status.offsets_behind, 1.0),
                (catalog.SPEED_INPUT_RATE, status.input_rows_per_second, 1.0),
                (catalog.SPEED_PROCESSED_RATE, status.processed_rows_per_second, 1.0),
                (catalog.SPEED_BATCH_SECONDS, status.batch_duration_ms, 0.001),
            ):
                if number is not None:
                    yield spec.family(number * scale)
            if status.invalid_records_total is not None:
                yield catalog.SPEED_INVALID.family(status.invalid_records_total)

    def _rejected(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        rejected = catalog.REJECTED.family()
        for reason, count in inventory.rejected_by_reason(snap).items():
            rejected.add_metric([reason], count)
        yield rejected

    def _stale(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        buckets = inventory.stale_buckets(snap)
        yield catalog.STALE_BUCKETS.family(len(buckets))
        yield catalog.STALE_EVENTS.family(sum(b.events for b in buckets))
        oldest = min((b.first_archived_at for b in buckets), default=None)
        age = 0.0 if oldest is None else max(time.time() - oldest.timestamp(), 0.0)
        yield catalog.STALE_AGE.family(age)

    def _drift(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        drift = inventory.drift(snap)
        error = catalog.DRIFT_RELATIVE.family()
        for measure, q, value in (
            ("impressions", "0.5", drift.impressions_p50),
            ("impressions", "0.99", drift.impressions_p99),
            ("clicks", "0.5", drift.clicks_p50),
            ("clicks", "0.99", drift.clicks_p99),
        ):
            if value is not None:
                error.add_metric([measure, q], value)
        yield error
        weighted = catalog.DRIFT_WEIGHTED.family()
        for measure, value in (
            ("impressions", drift.impressions_weighted),
            ("clicks", drift.clicks_weighted),
        ):
            if value is not None:
                weighted.add_metric([measure], value)
        yield weighted
        yield catalog.DRIFT_BUCKETS.family(drift.buckets)

    def _dlq(self) -> Iterator[Metric]:
        if self._dead_letters is not None:
            depth = self._dead_letters.records()
            if depth is not None:  # Kafka unreachable: left out (and logged), never an error
                dlq = catalog.DLQ.family()
                dlq.add_metric([self._dead_letters.topic], depth)
                yield dlq

    def _cache_counts(self) -> Iterator[Metric]:
        cache = self._cache()
        yield catalog.CACHE_HITS.family(cache.hits)
        yield catalog.CACHE_MISSES.family(cache.misses)
        yield catalog.CACHE_STALE_HITS.family(cache.stale_hits)
        yield catalog.CACHE_REFUSALS.family(cache.refusal_hits)
        yield catalog.CACHE_BYTES.family(cache.bytes)

    def _gate(self) -> Iterator[Metric]:
        assert self._ctr_gate is not None
        stats = self._ctr_gate().stats()
        yield catalog.QUERIES_RUNNING.family(stats.running)
        yield catalog.QUERIES_WAITING.family(stats.waiting)
        yield catalog.QUERIES_BUSY.family(stats.rejected_busy)

    def _sql(self) -> Iterator[Metric]:
        assert self._sql_pool is not None
        stats = self._sql_pool().stats()
        # Queries wait at the API's gate (a place in their key's share) and then for a worker.
        gate = self._sql_gate().stats() if self._sql_gate is not None else None
        waiting = stats.waiting + (gate.waiting if gate is not None else 0)
        busy = stats.rejected_busy + (gate.rejected_busy if gate is not None else 0)
        yield catalog.SQL_WORKERS.family(stats.workers)
        yield catalog.SQL_BUSY.family(stats.busy)
        yield catalog.SQL_QUEUED.family(waiting)
        outcomes = catalog.SQL_QUERIES.family()
        for outcome, count in (
            ("run", stats.queries),
            ("refused", stats.refused),
            ("failed", stats.failed),
            ("time_limit", stats.timed_out),
            ("busy", busy),
            ("backed_off", stats.backed_off),
        ):
            outcomes.add_metric([outcome], count)
        yield outcomes
        yield catalog.SQL_RESTARTS.family(stats.worker_restarts)


def object_store_requests(
    serving: ServingLayer, key_checks: Callable[[], int] | None
) -> Iterator[Metric]:
    """The object-store requests of keeping this process's view of the lake current."""
    requests = catalog.OBJECT_STORE_REQUESTS.family()
    counts = dict(serving.reader.snapshots.requests)
    if key_checks is not None:
        counts["keys"] = key_checks()
    for kind, count in sorted(counts.items()):
        requests.add_metric([kind], count)
    yield requests
