"""reference/metrics.md: every metric each process exports, from the declarations the code
exports them from (:data:`runtime.metrics.CATALOG`), and the alerts of the shipped rules
(ops/prometheus/rules) with what each watches."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import yaml

from reference import markdown
from runtime.metrics import MetricSpec

# The modules that declare metrics (each imports ``metric`` from runtime.metrics; a unit test
# checks none is missing).
DECLARING: Final = (
    "api.metric_catalog",
    "runtime.stream_metrics",
    "alerts.metrics",
    "batch_layer.metrics",
)
RULES: Final = Path(__file__).resolve().parent.parent / "ops" / "prometheus" / "rules"


def specs() -> list[MetricSpec]:
    """Every declared metric (the declaring modules imported), by process then name."""
    from runtime.metrics import CATALOG, PROCESSES

    for module in DECLARING:
        importlib.import_module(module)
    order = list(PROCESSES)
    return sorted(CATALOG.values(), key=lambda s: (order.index(s.process), s.name))


def _processes() -> Iterator[str]:
    from runtime.metrics import PROCESSES

    declared = specs()
    for process, (title, what) in PROCESSES.items():
        yield f"## {title}"
        yield ""
        yield f"{what}."
        yield ""
        rows = [
            [markdown.code(s.exposed), s.kind, ", ".join(markdown.code(x) for x in s.labels),
             s.help]
            for s in declared
            if s.process == process
        ]  # fmt: skip
        yield markdown.table(("metric", "type", "labels", "meaning"), rows)


def _rules() -> Iterator[dict[str, Any]]:
    """The shipped rules, file by file, in their order."""
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def _alerts() -> Iterator[str]:
    yield "## Alerts"
    yield ""
    yield (
        "The rules shipped in `ops/prometheus/rules/` (tested firing and quiet by "
        "`promtool test rules ops/prometheus/tests/ctr.test.yml`). What each means and what to "
        "do: [Operate it](../guides/operations.md#alerts)."
    )
    yield ""
    rows = [
        [f"[{rule['alert']}](../guides/operations.md#{rule['annotations']['runbook'].split('#')[1]})",
         rule.get("labels", {}).get("severity", ""), rule.get("for", "0s"),
         markdown.code(" ".join(rule["expr"].split()))]
        for rule in _rules() if "alert" in rule
    ]  # fmt: skip
    yield markdown.table(("alert", "severity", "for", "expression"), rows)
    yield "## Recording rules"
    yield ""
    recorded = [[markdown.code(rule["record"]), markdown.code(" ".join(rule["expr"].split()))]
                for rule in _rules() if "record" in rule]  # fmt: skip
    yield markdown.table(("series", "expression"), recorded)


def render() -> str:
    """The metrics page."""
    intro = (
        "What each process exports in Prometheus' text format, and where. Every process also "
        "exports `process_start_time_seconds` (a restart changes it), its CPU and memory "
        "(`process_*`); Prometheus adds `up` per target. A counter's samples end in `_total`; a "
        "histogram's are `_bucket`, `_sum` and `_count`. How the demo scrapes them, and what "
        "to do when an alert fires: [Operate it](../guides/operations.md)."
    )
    body = [*_processes(), *_alerts()]
    return markdown.page(
        "Metrics", "`runtime/metrics.py` and the modules declaring metrics", intro, body
    )
