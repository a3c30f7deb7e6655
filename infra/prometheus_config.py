"""The Prometheus configuration for a set of ctr-lambda processes: a scrape job per process
(the names the rules in ops/prometheus/rules/ match), the API's scrape with its metrics token,
the rules. ``make demo`` writes its own with it; ops/prometheus/prometheus.yml is the same for
hosts of their own, to edit.

    python -m infra.prometheus_config --out run/demo/prometheus/prometheus.yml \\
        --api 127.0.0.1:8000 --api-token-file run/demo/prometheus/metrics-token \\
        --archiver 127.0.0.1:9401 --speed 127.0.0.1:9402 --alerts 127.0.0.1:9403 \\
        --pushgateway 127.0.0.1:9091 --broker-host 127.0.0.1:9100
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

RULES: Final = Path(__file__).resolve().parent.parent / "ops" / "prometheus" / "rules"
# The scrape jobs, each with the process it scrapes (the rules name them).
JOBS: Final = {
    "ctr-api": "ctr serve: GET /metrics (API_METRICS_TOKEN)",
    "ctr-archiver": "ctr archive (ARCHIVER_METRICS_PORT)",
    "ctr-speed": "ctr speed (SPEED_METRICS_PORT)",
    "ctr-alerts": "ctr alerts run (ALERTS_METRICS_PORT)",
    "ctr-pushgateway": "the Pushgateway the batch runs push to (CTR_METRICS_PUSHGATEWAY)",
    "ctr-broker-host": "the node exporter on each broker's host (its disks)",
}


@dataclass
class Targets:
    """host:port of each job's targets (several for API replicas, brokers)."""

    by_job: dict[str, list[str]] = field(default_factory=dict)
    api_token_file: str | None = None  # a file holding API_METRICS_TOKEN
    api_scheme: str = "http"


def render(targets: Targets, *, interval_s: float = 15.0, rules: Path = RULES) -> str:
    """The configuration, YAML."""
    unknown = set(targets.by_job) - set(JOBS)
    if unknown:
        raise ValueError(f"unknown scrape jobs {sorted(unknown)}: one of {', '.join(JOBS)}")
    scrapes: list[dict[str, Any]] = []
    for job, hosts in targets.by_job.items():
        if not hosts:
            continue
        scrape: dict[str, Any] = {"job_name": job, "static_configs": [{"targets": hosts}]}
        if job == "ctr-api":
            scrape["scheme"] = targets.api_scheme
            if targets.api_token_file is not None:
                scrape["authorization"] = {"credentials_file": targets.api_token_file}
        if job == "ctr-pushgateway":
            # The runs' own labels (job="ctr_batch", view) kept, not the scrape's.
            scrape["honor_labels"] = True
        scrapes.append(scrape)
    interval = f"{interval_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules / "*.yml")],
        "scrape_configs": scrapes,
    }
    header = "# Written by infra/prometheus_config.py: the ctr-lambda processes and their rules.\n"
    return header + str(yaml.safe_dump(config, sort_keys=False))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.prometheus_config",
        description="Write a Prometheus configuration scraping ctr-lambda's processes.",
    )
    parser.add_argument("--out", type=Path, required=True, help="the file to write")
    for job in JOBS:
        option = "--" + job.removeprefix("ctr-")
        what = f"a target of {job}: {JOBS[job]} (repeat for several)"
        parser.add_argument(option, action="append", default=[], metavar="HOST:PORT", help=what)
    parser.add_argument("--api-token-file", help="a file holding API_METRICS_TOKEN")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes")
    args = parser.parse_args(argv)
    targets = Targets(
        {job: getattr(args, job.removeprefix("ctr-").replace("-", "_")) for job in JOBS},
        api_token_file=args.api_token_file,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(targets, interval_s=args.interval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
