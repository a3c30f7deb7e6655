"""The results table's rows of the benchmarks whose headline takes the most words (and the
row itself): :mod:`bench.report` keeps the rest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    """One benchmark's headline: what we measured, against what, and whether the goal is met."""

    benchmark: str
    measured: str
    reference: str
    ratio: str
    goal: str
    met: bool | None  # None: no result (failed or not run)


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{float(value):,.{digits}f}"


def _replicas(r: Mapping[str, Any]) -> Row:
    runs, speedup = r["runs"], r["speedup"]
    counted = [key for key in runs if key != "1-direct"]
    measured = f"the serving mix through HAProxy, {r['clients']} clients: " + "; ".join(
        f"{key} replica{'s' if key != '1' else ''} {_num(runs[key]['requests_per_s'])} req/s, "
        f"p50 {runs[key]['p50_ms']:.1f} ms, p99 {runs[key]['p99_ms']:.1f} ms"
        for key in counted
    )
    direct = runs.get("1-direct")
    if direct:
        measured += (
            f"; one replica without the balancer {_num(direct['requests_per_s'])} req/s, "
            f"p99 {direct['p99_ms']:.1f} ms"
        )
    idle = [
        p["idle_object_store_requests_per_s"]
        for run in runs.values()
        for p in run["per_replica"].values()
        if p["idle_object_store_requests_per_s"] is not None
    ]
    measured += (
        f"; object-store requests per replica at idle ≤ {max(idle):.1f}/s"
        if idle
        else "; object-store requests not counted"
    )
    goal = "2 replicas ≥ 1.6× one, 3 ≥ 2.2×"
    if not r["judged"]:
        goal += f" (not judged on {r['cores']} cores: the replicas share them)"
    return Row(
        "replicas",
        measured,
        "one replica behind HAProxy",
        " / ".join(f"{x:.2f}" for x in speedup.values()) or "—",
        goal,
        r["met"],
    )


def _state(r: Mapping[str, Any]) -> Row:
    ours = r["ours"]["snapshots"]
    cold, bound = ours["cold_start"], 1 + ours["snapshot_every"]
    without = r["ours"]["no_snapshots"]["cold_start"]
    measured = (
        f"ours: a 1-s micro-batch of {_num(r['rate'])} events/s over {r['partitions']} "
        f"partitions p50 {ours['batch_ms']['p50']} ms, p95 {ours['batch_ms']['p95']} ms "
        "(one core); "
        f"cold start after {r['minutes']} min: at most {cold['objects_read_max']} objects per "
        f"partition, {cold['seconds_total']} s (without snapshots "
        f"{without['objects_read_max']}, {without['seconds_total']} s)"
    )
    references, ratios = [], []
    for mode, cost in r["spark_state_cost"].items():
        spark = r["spark"][mode]
        restore = [p["restore"]["objects"] for p in spark["checkpoint"]["partitions"].values()]
        batch = spark["phase_ms"]["triggerExecution"]
        references.append(
            f"Spark {mode} (RocksDB, over {r['spark_minutes']} min): batch p50 {batch['p50']} ms, "
            f"p95 {batch['p95']} ms, the state's share p50 {cost['batch_ms']['p50']} ms, p95 "
            f"{cost['batch_ms']['p95']} ms; cold restart {spark['restart']['first_batch_s']} s, "
            f"a cold load at most {max(restore, default=0)} objects per partition"
        )
        if ours["batch_ms"]["p95"] and cost["batch_ms"]["p95"] is not None:
            ratios.append(f"{cost['batch_ms']['p95'] / ours['batch_ms']['p95']:.2f}")
    return Row(
        "state",
        measured,
        "; ".join(references) or "—",
        "; ".join(ratios) or "—",
        f"cold start ≤ {bound} objects per partition; Spark's counts equal ours",
        cold["objects_read_max"] <= bound and bool(r["correctness"]["equal"]),
    )


def _beside_batch(r: Mapping[str, Any]) -> Row:
    phases = r["phases"]
    quiet, before, after = (
        phases["quiet"],
        phases["batch, nice 0"],
        phases["batch, lowered weight"],
    )

    def figures(p: Mapping[str, Any]) -> str:
        return (
            f"p99 {p['p99_ms']:.0f} ms (refresh p99 {p['refresh_p99_ms']:.0f} ms, "
            f"{_num(p['errors'])} errors)"
        )

    measured = (
        f"{r['users']} dashboards refreshing every {r['refresh_s']:.0f} s: alone {figures(quiet)}; "
        f"beside `ctr batch` of a day ({_num(r['events'])} events) at the API's weight "
        f"{figures(before)}, batch {before['batch_s']:.0f} s; at niceness {r['batch_nice']} "
        f"{figures(after)}, batch {after['batch_s']:.0f} s"
    )
    return Row(
        "beside-batch",
        measured,
        f"the dashboards alone: p99 {quiet['p99_ms']:.0f} ms",
        f"{after['p99_ms'] / quiet['p99_ms']:.2f}",
        "p99 ≤ 1 s beside a batch run",
        after["p99_ms"] <= 1000 and after["errors"] == 0,
    )
