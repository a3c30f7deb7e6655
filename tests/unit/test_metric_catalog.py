"""The metrics' declarations: every module declaring one is listed for the reference, each name
is declared once and reads as Prometheus names do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reference import metrics_page
from runtime.metrics import PROCESSES, MetricSpec, metric

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "alerts", "batch_layer", "master_dataset", "runtime", "serving_layer",
            "speed_layer", "workflows", "cli", "infra", "lake", "ingest")  # fmt: skip


def test_every_module_that_declares_metrics_is_read_by_the_reference() -> None:
    declaring = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if re.search(r"from runtime\.metrics import [^\n]*\bmetric\b", text):
                declaring.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert declaring == set(metrics_page.DECLARING)


def test_each_metric_is_named_and_explained_once() -> None:
    specs = metrics_page.specs()
    assert len(specs) >= 60
    assert len({s.name for s in specs}) == len(specs)
    for spec in specs:
        assert re.fullmatch(r"ctr_[a-z0-9_]+", spec.name), spec.name
        assert not spec.name.endswith("_total"), f"{spec.name}: a counter's _total is added"
        assert spec.process in PROCESSES
        assert len(spec.help) > 10, spec.name
    # Units in the name, as Prometheus' conventions ask.
    for spec in specs:
        if re.search(r"_(duration|age)_", spec.name):
            assert spec.name.endswith("_seconds"), spec.name


def test_a_name_cannot_be_declared_twice_nor_for_an_unknown_process() -> None:
    existing: MetricSpec = metrics_page.specs()[0]
    with pytest.raises(ValueError, match="declared twice"):
        metric(existing.process, existing.name, "gauge", "again")
    with pytest.raises(ValueError, match="unknown process 'spark'"):
        metric("spark", "ctr_spark_something", "gauge", "a process no one runs")
