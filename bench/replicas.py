"""Replicas benchmark (issue 68): the serving benchmark's dashboard mix through a load balancer
(HAProxy, :mod:`infra.balancer`) over 1, 2 and 3 ``ctr serve`` replicas, each a process of its
own over one lake.

The lake is the serving benchmark's (:mod:`bench.serving_lake`: a day of minute buckets x 300
dimension combinations), built once; a writer commits to speed/ctr every second throughout, as
the stream does, so every replica keeps refreshing its snapshot. First one replica without the
balancer (what the balancer costs), then for each count of replicas: the replicas and the
balancer start, the balancer's readiness checks pass, a warm-up, then :data:`CLIENTS` clients
(wrk, else the Python client) walk the mix of distinct queries (:mod:`bench.serving_mix`)
through the balancer; then the replicas idle a while (no requests but the balancer's checks
and the benchmark's /metrics scrapes, each of which reads the lake's snapshot once). Reported
per count: requests per second, p50 and p99, errors; per replica: the requests the balancer
sent it, its response cache's hit rate, its object-store requests per second under load and at
idle (the counter :data:`OBJECT_STORE_COUNTER` of its /metrics; None where the API has no such
counter), and where the machine's CPU went (each process's CPU seconds: the replicas, HAProxy,
the load generator, this process with the speed writer; the rest idle).

Where the machine has fewer cores than a replica each plus one for the balancer and one for the
load generator, the replicas share the cores, and the throughput cannot grow with them there:
the output says so, and the goals (2 replicas at least 1.6x one, 3 at least 2.2x) are recorded
but not judged. A smoke run (``BENCH_REPLICAS_SMOKE=1``: a small lake, seconds per run, 1 and 2
replicas) writes ``bench/results/replicas-smoke.json``, not the results table.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import resource
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.serving_lake import COMBOS, END, HOURS, SpeedWriter, build_lake, combos, write_arrivals
from bench.serving_load import AUTH, CLIENTS, TOKEN, api_load, cache_delta, cache_metrics
from bench.serving_load import python_load as python_client
from bench.serving_mix import MIX_QUERIES, dashboard_mix, request_path
from infra.balancer import Balancer, BalancerConfig
from infra.broker import free_port
from infra.replicas import ApiReplicas
from lake.settings import LakeSettings

RESULTS = Path("bench/results")
# The object-store requests an API process made, by kind (another part of issue 68 adds it to
# /metrics; the samples are its ``_total``). Absent: the per-replica counts are None.
OBJECT_STORE_COUNTER: Final = "ctr_object_store_requests"
GOAL: Final = {2: 1.6, 3: 2.2}  # throughput over one replica's, by replicas


@dataclass(frozen=True)
class ReplicasBenchSettings:
    """The benchmark's sizes (``BENCH_REPLICAS_*`` in the environment)."""

    duration_s: float = 30.0  # each load's length
    idle_s: float = 10.0  # the idle window after each load
    # Seconds without requests before the idle window: a replica keeps its snapshot current for
    # 10 s after the last request (serving_layer.snapshots' keep_current_s).
    settle_s: float = 15.0
    warm_up_s: float = 5.0
    counts: tuple[int, ...] = (1, 2, 3)  # replicas per run
    combinations: int = COMBOS  # the lake's dimension combinations per minute
    smoke: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ReplicasBenchSettings:
        """What ``python -m bench replicas`` runs: the full run, or with
        ``BENCH_REPLICAS_SMOKE=1`` the smoke run; each size may be set on its own."""
        #: 1: the replicas benchmark's smoke run (a lake of 20 combinations, 3 s per load, 1
        #: and 2 replicas), written to bench/results/replicas-smoke.json; default 0.
        base = cls.smoke_run() if environ.get("BENCH_REPLICAS_SMOKE", "0") == "1" else cls()
        #: Seconds each load of the replicas benchmark runs; default 30.
        duration = environ.get("BENCH_REPLICAS_SECONDS")
        #: Seconds the replicas benchmark's replicas idle after each load (their object-store
        #: requests at idle); default 10.
        idle = environ.get("BENCH_REPLICAS_IDLE_SECONDS")
        #: The replicas benchmark's counts of replicas, comma-separated; default 1,2,3.
        counts = environ.get("BENCH_REPLICAS_COUNTS")
        return replace(
            base,
            duration_s=float(duration) if duration else base.duration_s,
            idle_s=float(idle) if idle else base.idle_s,
            counts=tuple(int(n) for n in counts.split(",")) if counts else base.counts,
        ).checked()

    @classmethod
    def smoke_run(cls) -> ReplicasBenchSettings:
        return cls(
            duration_s=3.0,
            idle_s=2.0,
            settle_s=0.0,
            warm_up_s=1.0,
            counts=(1, 2),
            combinations=20,
            smoke=True,
        )

    def checked(self) -> ReplicasBenchSettings:
        if self.duration_s <= 0 or min(self.idle_s, self.settle_s, self.warm_up_s) < 0:
            raise ValueError("the replicas benchmark's seconds must be positive")
        if not self.counts or min(self.counts) < 1 or 1 not in self.counts:
            raise ValueError(f"replica counts must include 1 and be >= 1, got {self.counts}")
        return self

    @property
    def name(self) -> str:
        return "replicas-smoke" if self.smoke else "replicas"


def main(events: int | None = None) -> dict[str, Any]:
    """``events`` is ignored (the lake is the serving benchmark's)."""
    return run(ReplicasBenchSettings.from_environ(os.environ), os.environ)


def run(
    settings: ReplicasBenchSettings, environ: Mapping[str, str], results: Path = RESULTS
) -> dict[str, Any]:
    """The benchmark with ``settings``; the replicas' environment is ``environ`` with the
    lake's and the API's settings. Writes ``results/<settings.name>.json``."""
    cores = os.cpu_count() or 1
    values = {
        name: [str(v) for v in column] for name, column in combos(settings.combinations).items()
    }
    mix = dashboard_mix(MIX_QUERIES, values=values, start=END - dt.timedelta(hours=HOURS), end=END)
    paths = [request_path(query) for query in mix]
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ctr-bench-replicas-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        print(f"bench {settings.name}: writing the lake ...", flush=True)
        rows = build_lake(lake, combinations=settings.combinations)
        write_arrivals(lake)
        replica_environ = {
            **environ,
            "LAKE_ROOT": str(lake.lake_root),
            "CHECKPOINT_ROOT": str(lake.checkpoint_root),
            "API_TOKEN": TOKEN,
            "API_TRUSTED_PROXIES": "127.0.0.1",
        }
        writer = SpeedWriter(lake)
        writer.start()
        try:
            runs["1-direct"] = _run(
                1, settings, replica_environ, paths, Path(scratch), balanced=False
            )
            for count in settings.counts:
                runs[str(count)] = _run(count, settings, replica_environ, paths, Path(scratch))
        finally:
            writer.stop.set()
            writer.join()
    one = runs["1"]["requests_per_s"]
    speedup = {
        str(n): runs[str(n)]["requests_per_s"] / one if one else 0.0
        for n in settings.counts
        if n > 1
    }
    judged = cores >= max(settings.counts) + 2
    met = (
        all(speedup[str(n)] >= goal for n, goal in GOAL.items() if str(n) in speedup)
        if judged
        else None
    )
    result: dict[str, Any] = {
        "benchmark": settings.name,
        "settings": asdict(settings),
        "lake_rows": rows,
        "mix_queries": len(paths),
        "clients": CLIENTS,
        "load_generator": runs["1"]["load_generator"],
        "cores": cores,
        "speed_commits": writer.commits,
        "runs": runs,
        "speedup": speedup,
        "object_store_counted": any(
            r["object_store_requests_per_s"] is not None
            for run_ in runs.values()
            for r in run_["per_replica"].values()
        ),
        "goal": "2 replicas >= 1.6x one, 3 replicas >= 2.2x",
        "judged": judged,
        "met": met,
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{settings.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(summary(result))
    return result


def _run(
    count: int,
    settings: ReplicasBenchSettings,
    environ: Mapping[str, str],
    paths: Sequence[str],
    scratch: Path,
    *,
    balanced: bool = True,
) -> dict[str, Any]:
    """``count`` replicas (behind the balancer, or one without it): the load, then idle."""
    label = f"{count} replica{'s' if count > 1 else ''}" + ("" if balanced else ", no balancer")
    run_dir = scratch / f"run-{count}-{'lb' if balanced else 'direct'}"
    with ApiReplicas(count, environ, run_dir) as replicas:
        balancer = None
        if balanced:
            config = BalancerConfig(port=free_port(), replicas=replicas.replicas)
            balancer = Balancer(config, run_dir)
            balancer.start()
        try:
            url = balancer.url if balancer is not None else replicas.url("api-1")
            if balancer is not None:
                balancer.wait_until_up()
            asyncio.run(python_client(url, settings.warm_up_s, CLIENTS, paths))
            print(f"bench {settings.name}: {label}, {CLIENTS} clients, the mix ...", flush=True)
            return _measure(replicas, balancer, url, settings, paths)
        finally:
            if balancer is not None:
                balancer.stop()


def _measure(
    replicas: ApiReplicas,
    balancer: Balancer | None,
    url: str,
    settings: ReplicasBenchSettings,
    paths: Sequence[str],
) -> dict[str, Any]:
    names = [replica.name for replica in replicas.replicas]
    pids = {name: replicas.pid(name) for name in names}
    if balancer is not None and balancer.pid is not None:
        pids["balancer"] = balancer.pid
    scraped = {name: _scrape(replicas.url(name)) for name in names}
    served = _served(balancer)
    cpu = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    children, itself = _rusage(resource.RUSAGE_CHILDREN), _rusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    load_generator, figures = api_load(url, settings.duration_s, paths)
    elapsed = time.monotonic() - started
    cpu = {name: _cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
    children = _rusage(resource.RUSAGE_CHILDREN) - children
    itself = _rusage(resource.RUSAGE_SELF) - itself
    loaded = {name: _scrape(replicas.url(name)) for name in names}
    served = {name: n - served.get(name, 0) for name, n in _served(balancer).items()}
    time.sleep(settings.settle_s)
    settled = {name: _scrape(replicas.url(name)) for name in names}
    time.sleep(settings.idle_s)
    idle = {name: _scrape(replicas.url(name)) for name in names}
    per_replica = {}
    for name in names:
        requests = served.get(name, figures["requests"] if balancer is None else 0)
        per_replica[name] = {
            "requests": requests,
            "share": requests / max(1, sum(served.values()) or figures["requests"]),
            "cache_hit_rate": cache_delta(scraped[name]["cache"], loaded[name]["cache"])[
                "cache_hit_rate"
            ],
            "object_store_requests_per_s": _rate(
                scraped[name]["object_store"], loaded[name]["object_store"], elapsed
            ),
            "idle_object_store_requests_per_s": _rate(
                settled[name]["object_store"], idle[name]["object_store"], settings.idle_s
            ),
            "cpu_s": cpu[name],
        }
    available = (os.cpu_count() or 1) * elapsed
    used = {
        "replicas": sum(cpu[name] for name in names),
        "balancer": cpu.get("balancer", 0.0),
        # wrk is a child this process waited for; the Python client runs in this process.
        "load_generator": children if load_generator == "wrk" else 0.0,
        "bench_process": itself,
    }
    return {
        "replicas": len(names),
        "balanced": balancer is not None,
        "load_generator": load_generator,
        **figures,
        "seconds": elapsed,
        "per_replica": per_replica,
        "cpu_s": {**used, "idle": max(0.0, available - sum(used.values()))},
        "cpu_available_s": available,
    }


def _scrape(url: str) -> dict[str, Any]:
    """A replica's response-cache counters and object-store requests from its /metrics."""
    answer = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30)
    answer.raise_for_status()
    text = answer.text
    return {"cache": cache_metrics(text), "object_store": object_store_requests(text)}


def object_store_requests(metrics: str) -> float | None:
    """The sum of :data:`OBJECT_STORE_COUNTER`'s samples in Prometheus text; None when it has
    none (an API without the counter)."""
    total, seen = 0.0, False
    for family in text_string_to_metric_families(metrics):
        if family.name in (OBJECT_STORE_COUNTER, f"{OBJECT_STORE_COUNTER}_total"):
            for sample in family.samples:
                if sample.name == f"{OBJECT_STORE_COUNTER}_total":
                    total, seen = total + sample.value, True
    return total if seen else None


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0:
        return None
    return (after - before) / seconds


def _served(balancer: Balancer | None) -> dict[str, int]:
    """Answers the balancer got from each replica so far."""
    if balancer is None:
        return {}
    return {name: sum(s.responses.values()) for name, s in balancer.replicas().items()}


def _cpu_seconds(pid: int) -> float:
    """A live process's CPU seconds (user and system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rusage(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def summary(result: Mapping[str, Any]) -> str:
    """The benchmark's figures as lines to print: per run, the load's and each replica's, and
    where the CPU went."""
    runs: Mapping[str, Mapping[str, Any]] = result["runs"]
    lines = []
    for key, r in runs.items():
        label = f"{r['replicas']} replica{'s' if r['replicas'] > 1 else ''}" + (
            " behind HAProxy" if r["balanced"] else ", no balancer"
        )
        ratio = "" if key in ("1", "1-direct") else f" (x{result['speedup'][key]:.2f} of one)"
        lines.append(
            f"{label}: {r['requests_per_s']:,.0f} req/s{ratio}, p50 {r['p50_ms']:.1f} ms, "
            f"p99 {r['p99_ms']:.1f} ms, {r['errors']:.0f} errors ({r['load_generator']})"
        )
        for name, p in r["per_replica"].items():
            store = p["object_store_requests_per_s"]
            idle = p["idle_object_store_requests_per_s"]
            lines.append(
                f"  {name}: {p['requests']:,} requests ({p['share']:.0%}), cache hit rate "
                f"{p['cache_hit_rate']:.0%}, CPU {p['cpu_s']:.1f} s, object-store requests "
                + (
                    f"{store:.1f}/s under load, {idle:.1f}/s at idle"
                    if store is not None and idle is not None
                    else "not counted"
                )
            )
        cpu = r["cpu_s"]
        lines.append(
            f"  where the CPU went ({r['cpu_available_s']:.0f} core-seconds over "
            f"{r['seconds']:.0f} s): replicas {cpu['replicas']:.1f} s, HAProxy "
            f"{cpu['balancer']:.1f} s, load generator {cpu['load_generator']:.1f} s, this "
            f"process (speed writer{', client' if r['load_generator'] != 'wrk' else ''}) "
            f"{cpu['bench_process']:.1f} s, idle {cpu['idle']:.1f} s"
        )
    if not result["object_store_counted"]:
        lines.append(
            f"object-store requests: not counted (the replicas' /metrics have no "
            f"{OBJECT_STORE_COUNTER}_total; bench.replicas.object_store_requests reads it)"
        )
    cores, counts = result["cores"], result["settings"]["counts"]
    if not result["judged"]:
        lines.append(
            f"this machine has {cores} cores: {max(counts)} replicas, HAProxy and the load "
            "generator share them, so more replicas cannot add throughput here; the goals "
            f"({result['goal']}) are not judged (they want {max(counts) + 2} cores)"
        )
    return "\n".join(lines)
