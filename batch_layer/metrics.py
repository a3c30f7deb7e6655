"""A batch run's metrics, pushed to the Pushgateway (CTR_METRICS_PUSHGATEWAY) when the run
ends: a run is too short-lived to be scraped. Grouped by the view's version (``view``), so each
push replaces that version's figures of the previous run; a failed run replaces only its own
figure, the last success stays."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry

from runtime.metrics import MetricsSettings, metric, push

if TYPE_CHECKING:
    from batch_layer.job import BatchRun

JOB: Final = "ctr_batch"
SUCCESS: Final = metric(
    "batch",
    "ctr_batch_last_success_timestamp_seconds",
    "gauge",
    "when the version's last successful run ended (Unix time)",
    ("view",),
)
FAILURE: Final = metric(
    "batch",
    "ctr_batch_last_failure_timestamp_seconds",
    "gauge",
    "when the version's last failed run ended (Unix time): later than the last success while "
    "runs fail",
    ("view",),
)
DURATION: Final = metric(
    "batch",
    "ctr_batch_run_duration_seconds",
    "gauge",
    "the last run's duration, commit retries included (a failed run's too)",
    ("view", "outcome"),
)
ROWS: Final = metric(
    "batch", "ctr_batch_run_rows", "gauge", "rows the last successful run wrote", ("view",)
)
INPUT_BYTES: Final = metric(
    "batch",
    "ctr_batch_run_input_bytes",
    "gauge",
    "bytes of master/events the last successful run read (the files its interval touches)",
    ("view",),
)
COVERED_END: Final = metric(
    "batch",
    "ctr_batch_covered_end_timestamp_seconds",
    "gauge",
    "the end of the interval the last successful run covered (Unix time)",
    ("view",),
)


def push_succeeded(run: BatchRun, seconds: float, settings: MetricsSettings) -> bool:
    """Push a finished run's figures (nothing without a Pushgateway)."""
    if settings.pushgateway is None:
        return False
    registry = CollectorRegistry()
    SUCCESS.gauge(registry).labels(run.view).set(time.time())
    DURATION.gauge(registry).labels(run.view, "success").set(seconds)
    ROWS.gauge(registry).labels(run.view).set(run.rows_written)
    INPUT_BYTES.gauge(registry).labels(run.view).set(run.input_bytes)
    COVERED_END.gauge(registry).labels(run.view).set(run.interval.end.timestamp())
    return push(registry, settings, JOB, view=run.view)


def push_failed(view: str, seconds: float, settings: MetricsSettings) -> bool:
    """Push a failed run's figures (the last success's stay)."""
    if settings.pushgateway is None:
        return False
    registry = CollectorRegistry()
    FAILURE.gauge(registry).labels(view).set(time.time())
    DURATION.gauge(registry).labels(view, "failure").set(seconds)
    return push(registry, settings, JOB, view=view)
