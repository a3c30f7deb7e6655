"""Prometheus over the platform: the shipped rules pass their promtool tests (each alert once
firing, once quiet), read only metrics the code exports, and a real Prometheus scrapes each
process's endpoint (the API, a streaming job's, the alerts runner as `ctr alerts run`, a batch
run's push through a real Pushgateway) and sees a killed process go down."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import SecretStr
from pyspark.sql import SparkSession

from api.settings import ApiSettings
from batch_layer import metrics as batch_metrics
from batch_layer.interval import Interval
from batch_layer.job import BatchJob, BatchRun
from infra.ports import free_port
from infra.prometheus_config import JOBS, Targets, render
from lake.settings import LakeSettings
from reference import metrics_page
from runtime.metrics import MetricsPortError, MetricsSettings, new_registry, serve
from runtime.stream_metrics import StreamMetrics
from runtime.streaming import StreamProgress
from tests.support.api_server import running_api
from tests.support.events import archive, event
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops" / "prometheus"
CTR = str(Path(sys.executable).with_name("ctr"))
TOKEN = "prometheus-test-token"
METRICS_TOKEN = "prometheus-scrape-token"


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """Prometheus' binaries (infra/prometheus.sh: fetched once by make test)."""
    found = subprocess.run(
        ["bash", str(ROOT / "infra" / "prometheus.sh")], capture_output=True, text=True, check=True
    )
    return Path(found.stdout.strip())


def _promtool(bin_dir: Path, *args: object) -> str:
    """promtool's output; an assertion with it when promtool says no."""
    done = subprocess.run(
        [bin_dir / "promtool", *map(str, args)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((OPS / "rules" / "ctr.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_rules_pass_their_promtool_tests(bin_dir: Path) -> None:
    _promtool(bin_dir, "check", "rules", OPS / "rules" / "ctr.yml")
    assert "SUCCESS" in _promtool(bin_dir, "test", "rules", OPS / "tests" / "ctr.test.yml")


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    cases = yaml.safe_load((OPS / "tests" / "ctr.test.yml").read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert len(alerts) >= 15
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested quiet"
    for rule in _rules():
        if "alert" in rule:
            anchor = rule["annotations"]["runbook"].split("#")[1]
            assert anchor == rule["alert"].lower()


def test_every_metric_a_rule_reads_is_exported_by_the_code() -> None:
    declared = metrics_page.specs()
    exported = {spec.exposed for spec in declared}
    exported |= {f"{s.name}_bucket" for s in declared if s.kind == "histogram"}
    # Prometheus' own (up), every process's (process_*), the node exporter's (node_*).
    foreign = re.compile(r"^(up|process_[a-z_]+|node_[a-z_]+)$")
    read = set()
    for rule in _rules():
        names = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.sub(r'"[^"]*"', "", rule["expr"]))
        read |= {n for n in names if n.startswith(("ctr_", "process_", "node_")) or n == "up"}
    assert {"ctr_stream_lag_records", "ctr_stale_age_seconds", "up"} <= read
    unknown = {n for n in read if n not in exported and not foreign.match(n)}
    assert unknown == set()


def test_the_shipped_and_the_demo_configurations_are_valid(bin_dir: Path, tmp_path: Path) -> None:
    _promtool(bin_dir, "check", "config", "--syntax-only", OPS / "prometheus.yml")
    shipped_jobs = {c["job_name"] for c in yaml.safe_load((OPS / "prometheus.yml").read_text())[
        "scrape_configs"]}  # fmt: skip
    assert shipped_jobs == set(JOBS)
    token = tmp_path / "token"
    token.write_text(METRICS_TOKEN)
    config = tmp_path / "prometheus.yml"
    targets = Targets({job: [f"127.0.0.1:{9400 + i}"] for i, job in enumerate(JOBS)}, str(token))
    config.write_text(render(targets))
    demo = _promtool(bin_dir, "check", "config", config)
    assert "21 rules found" in demo


@contextlib.contextmanager
def _process(args: list[Any], log: Path, env: dict[str, str] | None = None) -> Iterator[
    subprocess.Popen[bytes]]:  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(a) for a in args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _query(prometheus: str, expr: str) -> dict[str, float]:
    """An instant query's answer: the value of each series by its job label."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    return {r["metric"].get("job", ""): float(r["value"][1]) for r in answer["data"]["result"]}


def _progress(batch_id: int, rows: int) -> StreamProgress:
    return StreamProgress(
        batch_id=batch_id,
        input_rows=rows,
        input_rows_per_second=rows / 2,
        processed_rows_per_second=rows,
        batch_duration_ms=1000,
        offsets_behind=0,
        watermark=None,
        metrics={},
        phases_ms={"tasks": 700, "events_commit": 200},
        counts={"events": rows - 3, "rejected": 3},
    )


def test_prometheus_scrapes_every_process_and_sees_one_go_down(
    bin_dir: Path, lake: LakeSettings, tmp_path: Path
) -> None:
    # A streaming job's endpoint (served as `ctr archive` serves it), with two batches counted.
    registry = new_registry()
    stream = StreamMetrics(registry, "archiver")
    stream.record(_progress(0, 500))
    stream.record(_progress(1, 300))
    archiver_port = serve(registry, 0, "127.0.0.1")
    # The alerts runner as the command runs it, over an empty lake.
    alerts_port = free_port()
    env = {**os.environ, "LAKE_ROOT": str(lake.lake_root),
           "CHECKPOINT_ROOT": str(lake.checkpoint_root),
           "ALERTS_METRICS_PORT": str(alerts_port), "ALERTS_POLL_S": "1"}  # fmt: skip
    pushgateway_port, prometheus_port = free_port(), free_port()
    token = tmp_path / "metrics-token"
    token.write_text(METRICS_TOKEN)
    settings = ApiSettings(token=SecretStr(TOKEN), metrics_token=SecretStr(METRICS_TOKEN))
    with (
        running_api(settings, lake) as api,
        _process([CTR, "alerts", "run"], tmp_path / "alerts.log", env) as alerts,
        _process(
            [bin_dir / "prometheus-pushgateway",
             f"--web.listen-address=127.0.0.1:{pushgateway_port}"],
            tmp_path / "pushgateway.log",
        ),
    ):  # fmt: skip
        targets = Targets(
            {
                "ctr-api": [api.removeprefix("http://")],
                "ctr-archiver": [f"127.0.0.1:{archiver_port}"],
                "ctr-alerts": [f"127.0.0.1:{alerts_port}"],
                "ctr-pushgateway": [f"127.0.0.1:{pushgateway_port}"],
            },
            api_token_file=str(token),
        )
        config = tmp_path / "prometheus.yml"
        config.write_text(render(targets, interval_s=1))
        prometheus = f"http://127.0.0.1:{prometheus_port}"
        # A batch run's figures, pushed as a run pushes them when it ends.
        hour = Interval(dt.datetime(2026, 11, 30, 10, tzinfo=dt.UTC),
                        dt.datetime(2026, 11, 30, 11, tzinfo=dt.UTC))  # fmt: skip
        run = BatchRun("run-1", hour, 7, 1234, "ctr", 5678)
        pushgateway = MetricsSettings(pushgateway=f"http://127.0.0.1:{pushgateway_port}")
        wait_until(
            lambda: batch_metrics.push_succeeded(run, 12.5, pushgateway),
            timeout_s=30,
            what="the Pushgateway took a batch run's push",
            poll_s=0.5,
        )
        with _process(
            [bin_dir / "prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            tmp_path / "prometheus.log",
        ):  # fmt: skip

            def all_up() -> dict[str, float] | None:
                with contextlib.suppress(httpx.HTTPError, ValueError):  # not ready: 503, text
                    up = _query(prometheus, "up")
                    return up if up == dict.fromkeys(targets.by_job, 1.0) else None
                return None

            wait_until(all_up, timeout_s=60, what="every target up", poll_s=0.5)
            assert _query(prometheus, 'ctr_stream_records_total{query="archiver"}') == {
                "ctr-archiver": 800.0
            }
            assert _query(prometheus, 'ctr_batch_run_rows{view="ctr"}') == {"ctr_batch": 1234.0}
            assert _query(prometheus, "ctr_batch_run_input_bytes") == {"ctr_batch": 5678.0}
            # The API's own scrape: its requests, and the lake it reads (tables not created).
            assert "ctr-api" in _query(prometheus, "ctr_table_version")
            assert "ctr-alerts" in _query(prometheus, "ctr_alerts_evaluation_failures_total")
            # Every ctr_ series the processes exported is a declared metric (the reference
            # lists each): the names Prometheus stored, less the samples' suffixes.
            answer = httpx.get(f"{prometheus}/api/v1/label/__name__/values", timeout=10).json()
            stored = {n for n in answer["data"] if n.startswith("ctr_")}
            declared = {s.name for s in metrics_page.specs()}
            bare = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in stored}
            assert bare - declared == set()
            assert len(bare) >= 30
            rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
            loaded = {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"}
            assert {"CtrProcessDown", "CtrStreamStalled", "CtrBrokerDiskFilling"} <= loaded

            # The alerts runner killed: its target goes down, CtrProcessDown becomes pending
            # (it fires once down for a minute).
            alerts.kill()
            alerts.wait()
            wait_until(
                lambda: _query(prometheus, 'up{job="ctr-alerts"}') == {"ctr-alerts": 0.0},
                timeout_s=30,
                what="the killed runner's target down",
                poll_s=0.5,
            )

            def pending() -> bool:
                answer = httpx.get(f"{prometheus}/api/v1/alerts", timeout=10).json()
                return any(a["labels"]["alertname"] == "CtrProcessDown"
                           and a["labels"]["job"] == "ctr-alerts" and a["state"] == "pending"
                           for a in answer["data"]["alerts"])  # fmt: skip

            wait_until(pending, timeout_s=30, what="CtrProcessDown pending", poll_s=0.5)
    stream.close()


def test_a_taken_metrics_port_is_a_clear_error() -> None:
    registry = new_registry()
    port = serve(registry, 0, "127.0.0.1")
    with pytest.raises(MetricsPortError, match=rf"127\.0\.0\.1:{port} \(SPEED_METRICS_PORT"):
        serve(new_registry(), port, "127.0.0.1", "SPEED_METRICS_PORT")


def _gateway_samples(url: str) -> dict[str, float]:
    """The Pushgateway's own exposition, ``name{labels}`` -> value, for ctr_batch_ samples."""
    found = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("ctr_batch_"):
            series, value = line.rsplit(" ", 1)
            found[re.sub(r'instance="",?', "", series)] = float(value)
    return found


def test_a_batch_run_pushes_its_figures_and_a_failed_one_its_failure(
    bin_dir: Path, spark: SparkSession, lake: LakeSettings, tmp_path: Path
) -> None:
    start = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
    hour = Interval(start, start + dt.timedelta(hours=1))
    minute = dt.timedelta(minutes=1)
    archive(spark, lake, [event("a", "impression", start), event("b", "click", start + minute),
                          event("c", "impression", start + 2 * minute, ad="ad-2")])  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _process(
        [bin_dir / "prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}"],
        tmp_path / "pushgateway.log",
    ):
        wait_until(lambda: _answers(url), timeout_s=30, what="the Pushgateway up", poll_s=0.2)
        job = BatchJob(spark, lake, metrics=MetricsSettings(pushgateway=url))
        done = job.run(hour)
        pushed = _gateway_samples(url)
        assert pushed['ctr_batch_run_rows{job="ctr_batch",view="ctr"}'] == done.rows_written == 3
        assert pushed['ctr_batch_covered_end_timestamp_seconds{job="ctr_batch",view="ctr"}'] == (
            hour.end.timestamp()
        )
        assert pushed['ctr_batch_run_input_bytes{job="ctr_batch",view="ctr"}'] > 0
        succeeded = pushed['ctr_batch_last_success_timestamp_seconds{job="ctr_batch",view="ctr"}']
        # A run that fails (the view's table is a file) pushes its failure; the success stays.
        blocker = Path(lake.table("batch/ctr"))
        shutil.rmtree(blocker)
        blocker.write_text("not a table")
        with pytest.raises(OSError, match="Not a directory"):
            job.run(hour)
        pushed = _gateway_samples(url)
        failed = pushed['ctr_batch_last_failure_timestamp_seconds{job="ctr_batch",view="ctr"}']
        assert failed >= succeeded
        assert pushed['ctr_batch_last_success_timestamp_seconds{job="ctr_batch",view="ctr"}'] == (
            succeeded
        )
        assert 'ctr_batch_run_duration_seconds{job="ctr_batch",outcome="failure",view="ctr"}' in (
            pushed
        )


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    return False
