"""Prometheus metrics: requests (count, latency) per route, and the lake's state per scrape."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from access.roles import Access
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
        self.requests = Counter(
            "ctr_api_requests",
            "HTTP requests by method, route and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "ctr_api_request_duration_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=_BUCKETS,
            registry=registry,
        )

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
        errors = GaugeMetricFamily(
            "ctr_metrics_errors",
            "parts of this scrape that failed (see the server log)",
            labels=["part"],
        )
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
        versions = GaugeMetricFamily(
            "ctr_table_version",
            "Delta version of each table (-1: not created yet)",
            labels=["table"],
        )
        for name, version in snap.versions().items():
            versions.add_metric([name], -1 if version is None else version)
        yield versions
        rows = GaugeMetricFamily(
            "ctr_table_rows", "rows in each table (0: not created yet)", labels=["table"]
        )
        for name in snap.tables:
            rows.add_metric([name], inventory.table_info(snap[name]).rows)
        yield rows

    def _freshness(self, serving: ServingLayer, snap: LakeSnapshot) -> Iterator[Metric]:
        fresh = serving.freshness(snap)
        for name, value, help_text in (
            ("ctr_latest_covered_bucket", fresh.latest_covered_bucket, "last exact minute"),
            ("ctr_latest_speed_bucket", fresh.latest_speed_bucket, "newest speed minute"),
            ("ctr_speed_status_updated", fresh.speed_updated_at, "last speed job report"),
            ("ctr_speed_watermark", fresh.speed_watermark, "speed job watermark"),
        ):
            if value is not None:
                yield GaugeMetricFamily(
                    f"{name}_timestamp_seconds", f"{help_text} (Unix time)", value.timestamp()
                )
        status = snap.status
        if status is not None:
            for name, number, help_text in (
                ("ctr_speed_lag_records", status.offsets_behind, "Kafka records not read yet"),
                ("ctr_speed_input_rows_per_second", status.input_rows_per_second, "input rate"),
                (
                    "ctr_speed_processed_rows_per_second",
                    status.processed_rows_per_second,
                    "processing rate",
                ),
                ("ctr_speed_batch_duration_seconds", status.batch_duration_ms, "last micro-batch"),
            ):
                if number is not None:
                    scale = 0.001 if name.endswith("duration_seconds") else 1.0
                    yield GaugeMetricFamily(name, help_text, number * scale)
            if status.invalid_records_total is not None:
                yield CounterMetricFamily(
                    "ctr_speed_invalid_records",
                    "records the speed job skipped as invalid, since its checkpoint began",
                    status.invalid_records_total,
                )

    def _rejected(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        rejected = CounterMetricFamily(
            "ctr_rejected_records",
            "records in master/rejected by reason kind (the field a reason names)",
            labels=["reason"],
        )
        for reason, count in inventory.rejected_by_reason(snap).items():
            rejected.add_metric([reason], count)
        yield rejected

    def _stale(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        buckets = inventory.stale_buckets(snap)
        yield GaugeMetricFamily(
            "ctr_stale_buckets",
            "covered minute buckets with events no batch run has counted yet",
            len(buckets),
        )
        yield GaugeMetricFamily(
            "ctr_stale_events", "late events not yet recomputed", sum(b.events for b in buckets)
        )
        oldest = min((b.first_archived_at for b in buckets), default=None)
        age = 0.0 if oldest is None else max(time.time() - oldest.timestamp(), 0.0)
        yield GaugeMetricFamily(
            "ctr_stale_age_seconds",
            "how long the oldest uncounted late event has waited for a recompute (0: none)",
            age,
        )

    def _drift(self, inventory: Inventory, snap: LakeSnapshot) -> Iterator[Metric]:
        drift = inventory.drift(snap)
        error = GaugeMetricFamily(
            "ctr_drift_relative_error",
            "|speed - batch| / batch per minute the latest runs covered for the first time "
            "(minutes of 100 or more batch events)",
            labels=["measure", "quantile"],
        )
        for measure, q, value in (
            ("impressions", "0.5", drift.impressions_p50),
            ("impressions", "0.99", drift.impressions_p99),
            ("clicks", "0.5", drift.clicks_p50),
            ("clicks", "0.99", drift.clicks_p99),
        ):
            if value is not None:
                error.add_metric([measure, q], value)
        yield error
        weighted = GaugeMetricFamily(
            "ctr_drift_weighted_error",
            "sum |speed - batch| / sum batch over the minutes the latest runs covered first",
            labels=["measure"],
        )
        for measure, value in (
            ("impressions", drift.impressions_weighted),
            ("clicks", drift.clicks_weighted),
        ):
            if value is not None:
                weighted.add_metric([measure], value)
        yield weighted
        yield GaugeMetricFamily(
            "ctr_drift_buckets", "minutes the drift figures compare", drift.buckets
        )

    def _dlq(self) -> Iterator[Metric]:
        if self._dead_letters is not None:
            depth = self._dead_letters.records()
            if depth is not None:  # Kafka unreachable: left out (and logged), never an error
                dlq = GaugeMetricFamily(
                    "ctr_dlq_records", "records in the dead-letter topic", labels=["topic"]
                )
                dlq.add_metric([self._dead_letters.topic], depth)
                yield dlq

    def _cache_counts(self) -> Iterator[Metric]:
        cache = self._cache()
        yield CounterMetricFamily("ctr_api_cache_hits", "response cache hits", cache.hits)
        yield CounterMetricFamily("ctr_api_cache_misses", "response cache misses", cache.misses)
        yield CounterMetricFamily(
            "ctr_api_cache_stale_hits",
            "answers from the previous snapshot while the new one is computed",
            cache.stale_hits,
        )
        yield CounterMetricFamily(
            "ctr_api_cache_refusals",
            "refused answers (over a limit) given again from memory, not computed again",
            cache.refusal_hits,
        )
        yield GaugeMetricFamily("ctr_api_cache_bytes", "bytes of cached answers", cache.bytes)

    def _gate(self) -> Iterator[Metric]:
        assert self._ctr_gate is not None
        stats = self._ctr_gate().stats()
        yield GaugeMetricFamily(
            "ctr_api_queries_running", "CTR answers being computed", stats.running
        )
        yield GaugeMetricFamily(
            "ctr_api_queries_waiting", "CTR queries waiting for a place", stats.waiting
        )
        yield CounterMetricFamily(
            "ctr_api_queries_busy",
            "CTR queries refused with 429 (queue full or wait too long)",
            stats.rejected_busy,
        )

    def _sql(self) -> Iterator[Metric]:
        assert self._sql_pool is not None
        stats = self._sql_pool().stats()
        # Queries wait at the API's gate (a place in their key's share) and then for a worker.
        gate = self._sql_gate().stats() if self._sql_gate is not None else None
        waiting = stats.waiting + (gate.waiting if gate is not None else 0)
        busy = stats.rejected_busy + (gate.rejected_busy if gate is not None else 0)
        yield GaugeMetricFamily("ctr_sql_workers", "SQL worker processes", stats.workers)
        yield GaugeMetricFamily("ctr_sql_workers_busy", "SQL workers running a query", stats.busy)
        yield GaugeMetricFamily("ctr_sql_queued", "SQL queries waiting for a worker", waiting)
        outcomes = CounterMetricFamily(
            "ctr_sql_queries", "SQL queries by outcome", labels=["outcome"]
        )
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
        yield CounterMetricFamily(
            "ctr_sql_worker_restarts",
            "SQL worker processes replaced (killed at the time limit, died, or recycled)",
            stats.worker_restarts,
        )


def object_store_requests(
    serving: ServingLayer, key_checks: Callable[[], int] | None
) -> Iterator[Metric]:
    """The object-store requests of keeping this process's view of the lake current."""
    requests = CounterMetricFamily(
        "ctr_object_store_requests",
        "object-store requests this process made to keep its lake snapshot current (stats "
        "and reads of a local disk for a local lake), by kind: commit (a look for a "
        "table's next commit, found or not), reload (a table read whole by delta-rs, a "
        "few requests), exists (a table not created yet looked for), status (the speed "
        "job's status: a stat, and a read when it changed), keys (a look for a new commit "
        "of the key store)",
        labels=["kind"],
    )
    counts = dict(serving.reader.snapshots.requests)
    if key_checks is not None:
        counts["keys"] = key_checks()
    for kind, count in sorted(counts.items()):
        requests.add_metric([kind], count)
    yield requests
