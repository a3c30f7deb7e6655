"""The API's metrics (`GET /metrics` of `ctr serve`), declared once: the collectors export
them from these declarations and the metrics reference lists them."""

from __future__ import annotations

from typing import Final

from runtime.metrics import Kind, MetricSpec, metric


def _api(name: str, kind: Kind, help_text: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return metric("api", name, kind, help_text, labels)


# Requests (api.metrics.RequestMetrics) and the edge (api.server.EdgeCollector).
REQUESTS: Final = _api(
    "ctr_api_requests",
    "counter",
    "HTTP requests by method, route and status",
    ("method", "route", "status"),
)
REQUEST_SECONDS: Final = _api(
    "ctr_api_request_duration_seconds", "histogram", "HTTP request latency by route", ("route",)
)
EDGE_REFUSED: Final = _api(
    "ctr_api_edge_refused",
    "counter",
    "requests refused before parsing: head too large, too many headers, request line too "
    "long, head or body too slow, too many connections",
    ("reason",),
)
OPEN_CONNECTIONS: Final = _api("ctr_api_open_connections", "gauge", "open HTTP connections")
PG_OPEN: Final = _api(
    "ctr_api_pg_open_connections",
    "gauge",
    "open connections of the PostgreSQL endpoint (API_PG_PORT)",
)
PG_REFUSED: Final = _api(
    "ctr_api_pg_refused_connections",
    "counter",
    "PostgreSQL connections refused before their first query, by reason",
    ("reason",),
)
# The lake, read per scrape (api.metrics.LakeCollector).
ERRORS: Final = _api(
    "ctr_metrics_errors",
    "gauge",
    "parts of this scrape that failed (see the server log)",
    ("part",),
)
TABLE_VERSION: Final = _api(
    "ctr_table_version", "gauge", "Delta version of each table (-1: not created yet)", ("table",)
)
TABLE_ROWS: Final = _api(
    "ctr_table_rows", "gauge", "rows in each table (0: not created yet)", ("table",)
)
LATEST_COVERED: Final = _api(
    "ctr_latest_covered_bucket_timestamp_seconds", "gauge", "last exact minute (Unix time)"
)
LATEST_SPEED: Final = _api(
    "ctr_latest_speed_bucket_timestamp_seconds", "gauge", "newest speed minute (Unix time)"
)
SPEED_UPDATED: Final = _api(
    "ctr_speed_status_updated_timestamp_seconds",
    "gauge",
    "last speed job report (Unix time): its status on the lake, written each micro-batch",
)
SPEED_WATERMARK: Final = _api(
    "ctr_speed_watermark_timestamp_seconds", "gauge", "speed job watermark (Unix time)"
)
SPEED_LAG: Final = _api(
    "ctr_speed_lag_records",
    "gauge",
    "Kafka records the speed job had not read at its last micro-batch (its status on the lake)",
)
SPEED_INPUT_RATE: Final = _api(
    "ctr_speed_input_rows_per_second",
    "gauge",
    "the speed job's input rate in its last micro-batch (its status on the lake)",
)
SPEED_PROCESSED_RATE: Final = _api(
    "ctr_speed_processed_rows_per_second",
    "gauge",
    "the speed job's processing rate in its last micro-batch (its status on the lake)",
)
SPEED_BATCH_SECONDS: Final = _api("ctr_speed_batch_duration_seconds", "gauge", "last micro-batch")
SPEED_INVALID: Final = _api(
    "ctr_speed_invalid_records",
    "counter",
    "records the speed job skipped as invalid, since its checkpoint began",
)
REJECTED: Final = _api(
    "ctr_rejected_records",
    "counter",
    "records in master/rejected by reason kind (the field a reason names)",
    ("reason",),
)
STALE_BUCKETS: Final = _api(
    "ctr_stale_buckets",
    "gauge",
    "covered minute buckets with events no batch run has counted yet",
)
STALE_EVENTS: Final = _api("ctr_stale_events", "gauge", "late events not yet recomputed")
STALE_AGE: Final = _api(
    "ctr_stale_age_seconds",
    "gauge",
    "how long the oldest uncounted late event has waited for a recompute (0: none)",
)
DRIFT_RELATIVE: Final = _api(
    "ctr_drift_relative_error",
    "gauge",
    "|speed - batch| / batch per minute the latest runs covered for the first time "
    "(minutes of 100 or more batch events)",
    ("measure", "quantile"),
)
DRIFT_WEIGHTED: Final = _api(
    "ctr_drift_weighted_error",
    "gauge",
    "sum |speed - batch| / sum batch over the minutes the latest runs covered first",
    ("measure",),
)
DRIFT_BUCKETS: Final = _api("ctr_drift_buckets", "gauge", "minutes the drift figures compare")
DLQ: Final = _api("ctr_dlq_records", "gauge", "records in the dead-letter topic", ("topic",))
CACHE_HITS: Final = _api("ctr_api_cache_hits", "counter", "response cache hits")
CACHE_MISSES: Final = _api("ctr_api_cache_misses", "counter", "response cache misses")
CACHE_STALE_HITS: Final = _api(
    "ctr_api_cache_stale_hits",
    "counter",
    "answers from the previous snapshot while the new one is computed",
)
CACHE_REFUSALS: Final = _api(
    "ctr_api_cache_refusals",
    "counter",
    "refused answers (over a limit) given again from memory, not computed again",
)
CACHE_BYTES: Final = _api("ctr_api_cache_bytes", "gauge", "bytes of cached answers")
QUERIES_RUNNING: Final = _api("ctr_api_queries_running", "gauge", "CTR answers being computed")
QUERIES_WAITING: Final = _api("ctr_api_queries_waiting", "gauge", "CTR queries waiting for a place")
QUERIES_BUSY: Final = _api(
    "ctr_api_queries_busy",
    "counter",
    "CTR queries refused with 429 (queue full or wait too long)",
)
SQL_WORKERS: Final = _api("ctr_sql_workers", "gauge", "SQL worker processes")
SQL_BUSY: Final = _api("ctr_sql_workers_busy", "gauge", "SQL workers running a query")
SQL_QUEUED: Final = _api("ctr_sql_queued", "gauge", "SQL queries waiting for a worker")
SQL_QUERIES: Final = _api(
    "ctr_sql_queries",
    "counter",
    "SQL queries by outcome: run, refused, failed, time_limit, busy, backed_off",
    ("outcome",),
)
SQL_RESTARTS: Final = _api(
    "ctr_sql_worker_restarts",
    "counter",
    "SQL worker processes replaced (killed at the time limit, died, or recycled)",
)
OBJECT_STORE_REQUESTS: Final = _api(
    "ctr_object_store_requests",
    "counter",
    "object-store requests this process made to keep its lake snapshot current (stats and "
    "reads of a local disk for a local lake), by kind: commit (a look for a table's next "
    "commit, found or not), reload (a table read whole by delta-rs, a few requests), exists "
    "(a table not created yet looked for), status (the speed job's status: a stat, and a read "
    "when it changed), keys (a look for a new commit of the key store)",
    ("kind",),
)
