"""The alerts runner's metrics (`ctr alerts run`, ALERTS_METRICS_PORT): its evaluations, the
alerts they raised and the webhook deliveries' outcomes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from runtime.metrics import metric

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from alerts.runner import Tick

EVALUATIONS: Final = metric(
    "alerts",
    "ctr_alerts_evaluations",
    "counter",
    "minutes evaluated (each rule over its window ending at the minute), committed to "
    "alerts/events",
)
FAILURES: Final = metric(
    "alerts",
    "ctr_alerts_evaluation_failures",
    "counter",
    "evaluations that failed (logged; the minute is tried again at the next poll)",
)
LAST_EVALUATION: Final = metric(
    "alerts",
    "ctr_alerts_last_evaluation_timestamp_seconds",
    "gauge",
    "when the last evaluation was committed (Unix time)",
)
RULES: Final = metric("alerts", "ctr_alerts_rules", "gauge", "rules the last evaluation read")
TESTS: Final = metric(
    "alerts", "ctr_alerts_tests", "counter", "statistical tests run (a rule's groups each)"
)
HELD: Final = metric(
    "alerts",
    "ctr_alerts_held_evaluations",
    "counter",
    "evaluations that left the speed layer's counts untested (the speed job too far behind, "
    "ALERTS_MAX_SPEED_LAG_S)",
)
ALERTS: Final = metric(
    "alerts",
    "ctr_alerts_transitions",
    "counter",
    "alerts by event: fired, resolved, confirmed (the exact counts agree), withdrawn",
    ("event",),
)
DELIVERIES: Final = metric(
    "alerts",
    "ctr_alerts_deliveries",
    "counter",
    "webhook deliveries finished, by outcome: delivered; or a dead letter (a row of "
    "alerts/events): refused (the destination is not allowed), throttled (over "
    "ALERTS_MAX_DELIVERIES_PER_MINUTE), failed (no success after the tries)",
    ("outcome",),
)


class AlertMetrics:
    """The runner's metrics in ``registry``; :meth:`record` each evaluation."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.evaluations = EVALUATIONS.counter(registry)
        self.failures = FAILURES.counter(registry)
        self.last = LAST_EVALUATION.gauge(registry)
        self.rules = RULES.gauge(registry)
        self.tests = TESTS.counter(registry)
        self.held = HELD.counter(registry)
        self.alerts = ALERTS.counter(registry)
        self.deliveries = DELIVERIES.counter(registry)

    def record(self, tick: Tick) -> None:
        for delivery in tick.deliveries:
            self.deliveries.labels(str(delivery["delivery"])).inc()
        if not tick.committed:
            return
        self.evaluations.inc()
        self.last.set(time.time())
        self.rules.set(tick.rules)
        self.tests.inc(tick.tests)
        if tick.held:
            self.held.inc()
        for alert in tick.alerts:
            self.alerts.labels(str(alert["event"])).inc()

    def failed(self) -> None:
        self.failures.inc()
