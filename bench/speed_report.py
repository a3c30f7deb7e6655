"""The speed benchmark's results: per phase, the probes' latencies (committed and through the
API), whether the job kept up, and where a micro-batch's time went; printed, and written to
bench/results/speed.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

from bench.speed_api import ApiWatcher
from bench.speed_figures import (
    RESTART_BUCKETS_S,
    api_share,
    maintenance_passes,
    phases_per_batch,
)
from bench.speed_traffic import LIVE_RATE, MAIN_RATE, MAIN_SECONDS, Phase
from bench.speed_view import VIEW_RECORDS

RESULTS = Path("bench/results")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _latency_figures(latencies: list[float]) -> dict[str, float | None]:
    if not latencies:
        return {"p50_s": None, "p95_s": None, "max_s": None}
    return {
        "p50_s": round(statistics.median(latencies), 3),
        "p95_s": round(_percentile(latencies, 0.95), 3),
        "max_s": round(max(latencies), 3),
    }


def report(  # noqa: PLR0917
    phases: list[Phase],
    visible: dict[str, tuple[float, int]],
    watcher: ApiWatcher,
    work: Path,
    files: dict[str, int],
    view_breakdown: dict[str, float],
    backlog: dict[str, object],
) -> dict[str, object]:
    batch_phases = phases_per_batch(work / "speed.log")
    rows = []
    for phase in phases:
        committed = [visible[ad][0] - sent for ad, sent in phase.probes.items() if ad in visible]
        served = [watcher.seen[ad] - sent for ad, sent in phase.probes.items()
                  if ad in watcher.seen]  # fmt: skip
        missing = len(phase.probes) - len(committed)
        behind = [b for _, b in phase.behind]
        third = max(1, len(behind) // 3)
        # Keeping up: the backlog at the end of the phase is no bigger than at its start
        # (plus two seconds of input) and never above ~3 s of input.
        bounded = bool(behind) and max(behind) <= 3 * phase.rate
        flat = bool(behind) and max(behind[-third:]) <= max(behind[:third]) + 2 * phase.rate
        first, last = phase.batches
        in_phase = [p for batch, p in batch_phases.items()
                    if first <= batch <= last and p.get("view_rows", 0) > 0]  # fmt: skip
        rows.append(
            {
                "rate": phase.rate,
                "achieved_rate": round(phase.achieved_rate),
                "seconds": phase.seconds,
                "probes": len(phase.probes),
                "missing": missing,
                **_latency_figures(committed),
                "api": {**_latency_figures(served), "missing": len(phase.probes) - len(served)},
                "max_offsets_behind": max(behind) if behind else None,
                "kept_up": bounded and flat and missing == 0,
                "api_share_ms": api_share(phase, visible, watcher.requests),
                "batches": len(in_phase),
                "batch_phases_ms": _medians(in_phase),
                # The slowest micro-batch: a pause of the stream (a roll-up on the commit
                # path held one batch a minute) shows here, not in the medians.
                "slowest_batch_ms": max(
                    (p.get("spark.triggerExecution", 0) for p in in_phase), default=None
                ),
            }
        )
    live_row, main_row = rows[0], rows[1]
    sustained = max((int(str(r["achieved_rate"])) for r in rows if r["kept_up"]), default=0)
    api_main = main_row["api"]
    assert isinstance(api_main, dict)
    live_phases = live_row["batch_phases_ms"]
    assert isinstance(live_phases, dict)
    result: dict[str, object] = {
        "benchmark": "speed",
        "goal": "API freshness p95 <= 2 s at 5,000 events/s; a 2,000-record micro-batch "
        "<= 1 s; the backlog drained at >= 80,000 events/s with <= 100 KB to the driver per "
        "million events; after a restart, attributed clicks within 2 % of the exact count",
        "p50_s": main_row["p50_s"],
        "p95_s": main_row["p95_s"],
        "max_s": main_row["max_s"],
        "api_p50_s": api_main["p50_s"],
        "api_p95_s": api_main["p95_s"],
        "api_max_s": api_main["max_s"],
        "api_poll_errors": watcher.errors,
        "live_batch_ms_median": live_phases.get("spark.triggerExecution"),
        "highest_sustained_rate": sustained,
        "backlog": backlog,
        "phases": rows,
        "speed_ctr_files": files,
        "maintenance_passes": _passes(work / "speed.log"),
        "view_breakdown_ms": view_breakdown,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, local[2]",
    }
    print(
        f"bench speed: {MAIN_RATE:,} events/s for {MAIN_SECONDS:.0f} s: through the API "
        f"p50 {api_main['p50_s']} s, p95 {api_main['p95_s']} s, max {api_main['max_s']} s "
        f"(goal p95 <= 2 s); committed p50 {main_row['p50_s']} s, p95 {main_row['p95_s']} s"
    )
    for r in rows:
        api = r["api"]
        assert isinstance(api, dict)
        print(f"  {r['rate']:>6,}/s (achieved {r['achieved_rate']:,}/s): API p50 {api['p50_s']} s, "
              f"p95 {api['p95_s']} s, max {api['max_s']} s; committed p50 {r['p50_s']} s, "
              f"p95 {r['p95_s']} s; max behind {r['max_offsets_behind']}, "
              f"missing {r['missing']}, kept up: {r['kept_up']}; slowest batch "
              f"{r['slowest_batch_ms']} ms")  # fmt: skip
    print(
        f"bench speed: highest rate sustained without growing lag: {sustained:,} events/s "
        "(goal >= 20,000)"
    )
    print(
        "bench speed: where a micro-batch's time goes (median ms per batch; spark.* are "
        "Spark's trigger phases, addBatch holds the callback's):"
    )
    names = sorted({n for r in rows for n in r["batch_phases_ms"]},  # type: ignore[union-attr]
                   key=_phase_order)  # fmt: skip
    print("  " + f"{'phase':<24}" + "".join(f"{r['rate']:>9,}/s" for r in rows))
    for name in names:
        cells = "".join(
            f"{r['batch_phases_ms'].get(name, float('nan')):>11,.0f}"  # type: ignore[union-attr]
            for r in rows
        )
        print(f"  {name:<24}{cells}")
    passes = result["maintenance_passes"]
    assert isinstance(passes, dict)
    if passes["passes"]:
        print(
            f"bench speed: {passes['passes']} maintenance passes beside the micro-batches "
            f"(roll-up, compaction, pruning, VACUUM), median {passes['median_ms']:,} ms, "
            f"longest {passes['max_ms']:,} ms; median per part: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in passes["parts_median_ms"].items())
        )
    print("bench speed: after the commit, through the API (median ms: snapshot = commit until a "
          "request reading its version is sent; query = that request):")  # fmt: skip
    for name in ("snapshot", "query", "request"):
        cells = "".join(f"{r['api_share_ms'][name]:>11,.0f}" for r in rows)  # type: ignore[index]
        print(f"  {'api.' + name:<24}{cells}")
    print(
        f"bench speed: a live-sized micro-batch (~{LIVE_RATE:,} records): median "
        f"{result['live_batch_ms_median']} ms (goal <= 1,000 ms)"
    )
    print(
        f"bench speed: {VIEW_RECORDS:,} records in-process (median ms; the view's Spark job, "
        "then its rows written each way):"
        + "".join(f" {k} {v:,.0f};" for k, v in view_breakdown.items())
    )
    restart = backlog["restart"]
    assert isinstance(restart, dict)
    print(
        f"bench speed: a backlog of {backlog['events']:,} events after a restart, drained in "
        f"{backlog['batches']} micro-batches at {backlog['rate']:,} events/s (goal >= 80,000); "
        f"{backlog['result_bytes']:,} bytes returned to the driver, "
        f"{backlog['result_bytes_per_million']:,} per million events (goal <= 100 KB)"
    )
    print(
        f"bench speed: attributed clicks of the last {RESTART_BUCKETS_S} s of impressions before "
        f"the restart ({restart['buckets']} buckets): speed {restart['speed']:,}, exact "
        f"{restart['exact']:,}, error {restart['error']} (goal <= 0.02)"
    )
    print(f"bench speed: speed/ctr after the run: {files}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


_ORDER = (
    *("spark.latestOffset", "spark.queryPlanning", "spark.walCommit", "spark.getBatch"),
    *(
        "spark.addBatch",
        "plan",
        "tasks",
        "task.view",
        "task.attribution",
        "task.merge",
        "task.write",
        "late_commit",
        "ctr_commit",
        "view",
        "events",
        "split",
        "attribution",
        "late_write",
        "ctr_write",
        "rollup",
        "state_expiry",
        "maintenance",
        "maintenance_start",
    ),
    *("spark.commitOffsets", "spark.triggerExecution", "lag", "status", "view_rows"),
)


def _passes(log: Path) -> dict[str, object]:
    passes = maintenance_passes(log)
    totals = [sum(p.values()) for p in passes]
    return {
        "passes": len(totals),
        "median_ms": round(statistics.median(totals)) if totals else 0,
        "max_ms": max(totals, default=0),
        "parts_median_ms": _medians(passes) if passes else {},
    }


def _phase_order(name: str) -> tuple[int, str]:
    return (_ORDER.index(name) if name in _ORDER else len(_ORDER) - 1, name)


def _medians(batches: list[dict[str, int]]) -> dict[str, float]:
    names = {n for b in batches for n in b}
    return {n: statistics.median(b.get(n, 0) for b in batches) for n in sorted(names)}
