"""The replicas benchmark's pure parts: its sizes from the environment, the object-store counter
read from /metrics, and its row of the results table."""

from __future__ import annotations

from typing import Any

import pytest

from bench import report
from bench.replicas import ReplicasBenchSettings, object_store_requests, summary


def test_the_sizes_come_from_the_environment_and_smoke_is_small() -> None:
    full = ReplicasBenchSettings.from_environ({})
    assert (full.duration_s, full.counts, full.combinations, full.name) == (
        30.0,
        (1, 2, 3),
        300,
        "replicas",
    )
    smoke = ReplicasBenchSettings.from_environ(
        {"BENCH_REPLICAS_SMOKE": "1", "BENCH_REPLICAS_SECONDS": "5"}
    )
    assert (smoke.duration_s, smoke.counts, smoke.combinations, smoke.name) == (
        5.0,
        (1, 2),
        20,
        "replicas-smoke",
    )
    assert ReplicasBenchSettings.from_environ({"BENCH_REPLICAS_COUNTS": "1,4"}).counts == (1, 4)
    with pytest.raises(ValueError, match=r"must include 1 and be >= 1, got \(2, 3\)"):
        ReplicasBenchSettings.from_environ({"BENCH_REPLICAS_COUNTS": "2,3"})


def test_object_store_requests_are_the_counters_samples_summed() -> None:
    counted = """# HELP ctr_object_store_requests_total requests to the lake's store
# TYPE ctr_object_store_requests_total counter
ctr_object_store_requests_total{kind="list"} 40.0
ctr_object_store_requests_total{kind="get"} 2.0
# HELP ctr_api_cache_hits_total hits
# TYPE ctr_api_cache_hits_total counter
ctr_api_cache_hits_total 7.0
"""
    assert object_store_requests(counted) == 42.0
    assert object_store_requests("ctr_api_cache_hits_total 7.0\n") is None


def _run(
    replicas: int, rate: float, idle: float | None, *, balanced: bool = True
) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "balanced": balanced,
        "load_generator": "wrk",
        "requests_per_s": rate,
        "p50_ms": 20.0,
        "p99_ms": 80.0,
        "errors": 0,
        "seconds": 30.0,
        "cpu_available_s": 60.0,
        "cpu_s": {
            "replicas": 50.0,
            "balancer": 3.0,
            "load_generator": 4.0,
            "bench_process": 1.0,
            "idle": 2.0,
        },
        "per_replica": {
            f"api-{n}": {
                "requests": 100,
                "share": 1 / replicas,
                "cache_hit_rate": 0.1,
                "cpu_s": 50.0 / replicas,
                "object_store_requests_per_s": None if idle is None else 40.0,
                "idle_object_store_requests_per_s": idle,
            }
            for n in range(1, replicas + 1)
        },
    }


def _result(*, cores: int, idle: float | None) -> dict[str, Any]:
    judged = cores >= 5
    return {
        "clients": 32,
        "cores": cores,
        "settings": {"counts": [1, 2, 3]},
        "runs": {
            "1-direct": _run(1, 1100.0, idle, balanced=False),
            "1": _run(1, 1000.0, idle),
            "2": _run(2, 1700.0, idle),
            "3": _run(3, 2100.0, idle),
        },
        "speedup": {"2": 1.7, "3": 2.1},
        "object_store_counted": idle is not None,
        "goal": "2 replicas >= 1.6x one, 3 replicas >= 2.2x",
        "judged": judged,
        "met": False if judged else None,
    }


def test_the_results_row_gives_each_count_and_is_not_judged_on_too_few_cores() -> None:
    row = report.summarize("replicas", _result(cores=2, idle=3.0))
    assert row.measured == (
        "the serving mix through HAProxy, 32 clients: 1 replica 1,000 req/s, p50 20.0 ms, p99 "
        "80.0 ms; 2 replicas 1,700 req/s, p50 20.0 ms, p99 80.0 ms; 3 replicas 2,100 req/s, p50 "
        "20.0 ms, p99 80.0 ms; one replica without the balancer 1,100 req/s, p99 80.0 ms; "
        "object-store requests per replica at idle ≤ 3.0/s"
    )
    assert (row.ratio, row.met) == ("1.70 / 2.10", None)
    assert row.goal.endswith("(not judged on 2 cores: the replicas share them)")
    judged = report.summarize("replicas", _result(cores=8, idle=None))
    assert judged.met is False
    assert judged.measured.endswith("; object-store requests not counted")


def test_the_summary_says_where_the_cpu_went_and_that_the_cores_are_shared() -> None:
    lines = summary(_result(cores=2, idle=None)).splitlines()
    assert lines[0] == (
        "1 replica, no balancer: 1,100 req/s, p50 20.0 ms, p99 80.0 ms, 0 errors (wrk)"
    )
    assert "2 replicas behind HAProxy: 1,700 req/s (x1.70 of one)" in "\n".join(lines)
    assert lines[2] == (
        "  where the CPU went (60 core-seconds over 30 s): replicas 50.0 s, HAProxy 3.0 s, "
        "load generator 4.0 s, this process (speed writer) 1.0 s, idle 2.0 s"
    )
    assert lines[-2].startswith("object-store requests: not counted")
    assert lines[-1].startswith("this machine has 2 cores: 3 replicas, HAProxy and the load")
