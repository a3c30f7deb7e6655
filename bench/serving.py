"""Serving benchmark: dashboard queries over HTTP with 32 concurrent clients, against DuckDB.

A realistic lake (24 h of minute buckets x a few hundred dimension combinations: batch/ctr
with coverage for the first 22 h, speed/ctr for the rest) is written with delta-rs. The API
server runs in a subprocess (uvicorn, one worker) while a writer commits to speed/ctr every
second, as the streaming job does, so snapshots keep changing. Two loads, 32 concurrent clients
for 30 s each (wrk, else a Python client), p50/p99 latency and requests/s:

- the dashboard query (last 24 h, hourly, grouped by campaign) repeated, which the API's
  per-snapshot answer cache serves; its floor is the same SQL in-process in DuckDB over the
  same snapshot, from 32 threads for the same time;
- a mix of distinct dashboard queries (issue 20; :mod:`bench.serving_mix`: random ranges,
  filters, splits, top-N), each client walking it from its own offset, so the cache no longer
  hides the query cost: the response cache's hits, stale hits and misses over the run and its
  hit rate from /metrics. Its floor: the mix's SQL as the serving layer builds it, in-process
  over one snapshot, uncached, 32 threads each walking the mix from its own offset.

Then the cost of late arrivals (issue 18): the lake's master/arrivals holds the uncovered hours'
arrivals and late arrivals in 1 % of the covered minutes; one client runs the query's SQL with
and without the stale-arrivals branch, and the stale table (computed once per master/arrivals
and batch/coverage version) is timed. Results go to bench/results/serving.json (the mix under
``distinct_mix``).

Modules: :mod:`bench.serving_lake` (the lake, the writer, the dashboard query),
:mod:`bench.serving_load` (the HTTP load), :mod:`bench.serving_api` (the runs against the API
server), :mod:`bench.serving_in_process` (the floors and the one-client costs).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import serving_in_process as in_process
from bench.serving_api import ApiRuns, run_api
from bench.serving_lake import (
    ADVERTISER_CAMPAIGNS,
    END,
    HOURS,
    build_lake,
    combos,
    dashboard_params,
    write_arrivals,
)
from bench.serving_load import CLIENTS
from bench.serving_mix import MIX_QUERIES, MIX_SEED, dashboard_mix, request_path
from lake.settings import LakeSettings
from serving_layer.query import CtrQuery

DURATION_S = 30.0
RESULTS = Path("bench/results")


@dataclass(frozen=True)
class ServingBenchSettings:
    """What the serving benchmark takes from its environment, read once at its start."""

    duration_s: float  # each load's length: BENCH_SERVING_SECONDS, default DURATION_S
    environ: Mapping[str, str]  # the API server's, before the lake's and the API's settings

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ServingBenchSettings:
        return cls(
            #: Seconds each load runs; default DURATION_S (30).
            duration_s=float(environ.get("BENCH_SERVING_SECONDS", DURATION_S)),
            environ=dict(environ),
        )


def main(events: int | None = None) -> dict[str, object]:
    """``events`` is ignored (the lake's size is fixed: 24 h x COMBOS combinations)."""
    settings = ServingBenchSettings.from_environ(os.environ)
    duration = settings.duration_s
    values = {name: [str(v) for v in column] for name, column in combos().items()}
    mix = dashboard_mix(MIX_QUERIES, values=values, start=END - dt.timedelta(hours=HOURS), end=END)
    mix_paths = [request_path(query) for query in mix]
    with tempfile.TemporaryDirectory(prefix="ctr-bench-serving-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        print("bench serving: writing the lake ...", flush=True)
        rows = build_lake(lake)
        arrival_rows = write_arrivals(lake)
        runs = run_api(lake, duration, mix_paths, settings.environ)
        print(f"bench serving: the floor, in-process DuckDB, {CLIENTS} threads ...", flush=True)
        floor = in_process.dashboard_floor(lake, duration, CLIENTS)
        print(f"bench serving: the mix's floor, {CLIENTS} threads ...", flush=True)
        mix_floor = in_process.mix_floor(lake, mix, duration, CLIENTS)
        print("bench serving: the cost of the stale-arrivals branch, one client ...", flush=True)
        staleness = in_process.staleness_cost(lake)
        key_check = in_process.key_check_cost(lake)
        print("bench serving: the mix with and without a scope, one client ...", flush=True)
        scope_cost = in_process.scope_cost(lake, mix)
        print("bench serving: reach, the dashboard's queries with and without it ...", flush=True)
        reach_cost = in_process.reach_cost(lake)
    api, mix_api = runs.single, runs.mix
    mix_ratio = mix_api["p99_ms"] / mix_floor["p99_ms"]
    distinct_mix: dict[str, object] = {
        "queries": len(mix),
        "distinct_paths": len(set(mix_paths)),
        "seed": MIX_SEED,
        "shape": _mix_shape(mix),
        "example_paths": mix_paths[:5],
        "api": mix_api,
        "duckdb_floor": mix_floor,
        "p99_ratio": mix_ratio,
        "cache_hit_rate": mix_api["cache_hit_rate"],
        "goal": "mix p99 <= 2x the mix floor",
        "met": mix_ratio <= 2,
    }
    result: dict[str, object] = {
        "benchmark": "serving",
        "query": dashboard_params(),
        "lake_rows": rows,
        "clients": CLIENTS,
        "load_generator": runs.load_generator,
        "duration_s": duration,
        "api": api,
        "duckdb_floor": floor,
        "p99_ratio": api["p99_ms"] / floor["p99_ms"],
        "distinct_mix": distinct_mix,
        "arrival_rows": arrival_rows,
        "staleness": staleness,
        "advertiser": {
            "campaigns": list(ADVERTISER_CAMPAIGNS),
            "api": runs.advertiser_single,
            "mix": runs.advertiser_mix,
            "p50_vs_admin": runs.advertiser_single["p50_ms"] / api["p50_ms"],
            "p99_vs_admin": runs.advertiser_single["p99_ms"] / api["p99_ms"],
            "mix_p99_vs_admin": runs.advertiser_mix["p99_ms"] / mix_api["p99_ms"],
            "admin_mix_after": runs.admin_mix_after,
            "key_check": key_check,
            "scope_in_process": scope_cost,
        },
        "reach_in_process": reach_cost,
        "goal": "api p99 <= 50 ms and <= 2x the floor; mix p99 <= 2x the mix floor",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serving.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"API (HTTP, {CLIENTS} clients): p50 {api['p50_ms']:.1f} ms, p99 {api['p99_ms']:.1f} ms, "
        f"{api['requests_per_s']:,.0f} req/s, {api['errors']:.0f} errors "
        f"({runs.load_generator}), {runs.speed_commits} speed commits during the runs\n"
        f"DuckDB floor ({CLIENTS} threads): p50 {floor['p50_ms']:.1f} ms, "
        f"p99 {floor['p99_ms']:.1f} ms, {floor['requests_per_s']:,.0f} q/s "
        f"(one client: {floor['single_client_median_ms']:.1f} ms)\n"
        f"p99 ratio API/floor: {result['p99_ratio']:.2f}\n"
        f"mix of {len(set(mix_paths))} distinct queries, API: p50 {mix_api['p50_ms']:.1f} ms, "
        f"p99 {mix_api['p99_ms']:.1f} ms, {mix_api['requests_per_s']:,.0f} req/s, "
        f"{mix_api['errors']:.0f} errors; cache hit rate {mix_api['cache_hit_rate']:.1%} "
        f"({mix_api.get('cache_hits_total', 0):.0f} hits, "
        f"{mix_api.get('cache_stale_hits_total', 0):.0f} stale, "
        f"{mix_api.get('cache_misses_total', 0):.0f} misses)\n"
        f"mix floor ({CLIENTS} threads): p50 {mix_floor['p50_ms']:.1f} ms, "
        f"p99 {mix_floor['p99_ms']:.1f} ms, {mix_floor['requests_per_s']:,.0f} q/s "
        f"(one client: median {mix_floor['single_client_median_ms']:.1f} ms, "
        f"p99 {mix_floor['single_client_p99_ms']:.1f} ms)\n"
        f"mix p99 ratio API/floor: {mix_ratio:.2f} (goal <= 2: {'' if mix_ratio <= 2 else 'not '}"
        "met)\n"
        f"staleness, one client: the query {staleness['query_without_stale_ms']:.1f} ms without "
        f"the stale branch, {staleness['query_with_stale_ms']:.1f} ms with it "
        f"(ratio {staleness['ratio']:.2f}; {staleness['stale_rows']:,} stale rows); the stale "
        f"table {staleness['stale_table_ms']:.1f} ms per master/arrivals or coverage version\n"
        f"{_advertiser_line(runs, api, mix_api)}\n"
        f"per request, in process: a key's check {key_check['key_check_us']:.1f} us (a stat of "
        f"the key table's next log file, the hash, the lookup), API_TOKEN's "
        f"{key_check['api_token_check_us']:.2f} us\n"
        f"the mix in process, one client, interleaved: median {scope_cost['admin_median_ms']:.1f}"
        f" ms as the admin asks it, {scope_cost['advertiser_median_ms']:.1f} ms with the "
        f"advertiser's scope (ratio {scope_cost['median_ratio']:.2f}; p99 "
        f"{scope_cost['admin_p99_ms']:.1f} vs {scope_cost['advertiser_p99_ms']:.1f} ms; rows "
        f"{scope_cost['admin_rows']:,} vs {scope_cost['advertiser_rows']:,})"
    )
    print("reach=true, in process, one client (the better of 3; without -> with):")
    for name, cost in reach_cost.items():
        print(
            f"  {name}: {cost['without_ms']:.0f} -> {cost['with_ms']:.0f} ms "
            f"(x{cost['with_ms'] / cost['without_ms']:.0f})"
        )
    return result


def _advertiser_line(runs: ApiRuns, api: Mapping[str, float], mix_api: Mapping[str, float]) -> str:
    mine, mix, after = runs.advertiser_single, runs.advertiser_mix, runs.admin_mix_after
    return (
        f"advertiser key ({len(ADVERTISER_CAMPAIGNS)} of 20 campaigns), same run: dashboard "
        f"p50 {mine['p50_ms']:.1f} ms, p99 {mine['p99_ms']:.1f} ms, "
        f"{mine['requests_per_s']:,.0f} req/s, {mine['errors']:.0f} errors (admin: "
        f"p50 {api['p50_ms']:.1f}, p99 {api['p99_ms']:.1f} ms, {api['requests_per_s']:,.0f} "
        f"req/s); mix p50 {mix['p50_ms']:.1f} ms, p99 {mix['p99_ms']:.1f} ms, "
        f"{mix['requests_per_s']:,.0f} req/s, cache hit rate {mix['cache_hit_rate']:.1%} "
        f"(admin before: p50 {mix_api['p50_ms']:.1f}, p99 {mix_api['p99_ms']:.1f} ms, "
        f"{mix_api['requests_per_s']:,.0f} req/s; after: p50 {after['p50_ms']:.1f}, "
        f"p99 {after['p99_ms']:.1f} ms, {after['requests_per_s']:,.0f} req/s)"
    )


def _mix_shape(mix: Sequence[CtrQuery]) -> dict[str, dict[str, int]]:
    """How many of the mix's queries have each granularity, split, filter count, and top-N."""
    return {
        "granularity": dict(Counter(q.granularity for q in mix)),
        "group_by_dimensions": dict(Counter(str(len(q.group_by)) for q in mix)),
        "filtered_dimensions": dict(Counter(str(len(q.filters)) for q in mix)),
        "top_n": dict(Counter("yes" if q.order_by else "no" for q in mix)),
    }
