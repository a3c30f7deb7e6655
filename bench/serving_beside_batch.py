"""The dashboard while a batch run shares the machine (issue 71): the serving benchmark's lake
and API server, a few analysts' dashboards refreshing, first alone, then beside ``ctr batch``
recomputing a day.

The lake is :mod:`bench.serving_lake`'s (24 h of minute buckets x 300 dimension combinations
with reach at realistic cardinality, a speed commit every second) plus a day of master/events
(:func:`bench.batch._generate`: zipf-skewed ads and sites, 2 % duplicates). The load is
:data:`USERS` open dashboards, as the page refreshes (api/static/queries.js): every
:data:`REFRESH_S` seconds after the last refresh ended, the page's six queries at once (the
series and the totals with reach, three top-10 breakdowns, the campaign table with reach), each
user on its own range (1 h, 6 h, 24 h) and campaign filter, so answers are not shared. Three
phases, back to back in one process, the same load in each:

1. ``quiet``: the dashboards alone for :data:`QUIET_S` seconds;
2. ``batch, nice 0``: the dashboards while ``ctr batch`` of a whole day runs and
   :data:`AFTERMATH_S` after (its commit's new snapshot), the run in its own session (as `make
   demo` and Airflow start processes) at the API's CPU weight (``SPARK_BATCH_NICE=0``);
3. ``batch, lowered weight``: the same with ``SPARK_BATCH_NICE`` as the environment sets it
   (default 19);
4. ``quiet, after``: the dashboards alone again (what the API's cost did meanwhile: the speed
   commits every second are compacted every minute, as the speed job does).

Where the time goes: the CPU seconds of the API server, of the batch run's processes (``ctr
batch``, its JVM, its Python workers) and of the load generator in each phase, beside each
request's and each refresh's (all six answered) p50/p99/max, and errors (a status but 200).
Results go to bench/results/beside-batch.json.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from bench.batch import _generate as generate_events
from bench.serving_api import start_api_server
from bench.serving_lake import END, SpeedWriter, build_lake, combos
from bench.serving_load import AUTH, percentiles, wait_until_up
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from runtime.spark_settings import SparkSettings

#: Open dashboards (BENCH_DASHBOARDS): the demo's analyst and a colleague. Each costs the API
#: about a quarter of a core at this lake's cardinality (the page's three reach queries).
USERS = int(os.environ.get("BENCH_DASHBOARDS", "2"))
#: Seconds between the end of a dashboard's refresh and its next (api/static/app.js).
REFRESH_S = 5.0
#: Each user's range and its granularity (the page's 1 h, 6 h and 24 h views).
RANGES = (
    (dt.timedelta(hours=1), "minute"),
    (dt.timedelta(hours=6), "minute"),
    (dt.timedelta(hours=24), "hour"),
)
#: A refresh's queries (api/static/queries.js), from the view's granularity, and their names.
KINDS: Final = ("series", "totals", "by campaign", "by country", "by device", "table")
PAGE_QUERIES: tuple[Callable[[str], dict[str, str]], ...] = (
    lambda g: {"granularity": g, "reach": "true"},
    lambda g: {"granularity": "all", "reach": "true"},
    *(
        (lambda g, d=d: {"granularity": "all", "group_by": d, "order_by": "-clicks,-impressions",
                         "limit": "10"})
        for d in ("campaign_id", "country", "device_type")
    ),
    lambda g: {"granularity": "all", "group_by": "campaign_id", "order_by": "-clicks",
               "limit": "1000", "reach": "true"},
)  # fmt: skip
#: The quiet phase's length.
QUIET_S = 60.0
#: Seconds a batch phase goes on after its run ended (its commit turns the API's snapshot over).
AFTERMATH_S = 20.0
#: Events of the day the batch run recomputes.
DEFAULT_EVENTS = 1_000_000
RESULTS = Path("bench/results")
#: The days the two batch runs recompute, one each (a run of a day already covered by the same
#: input would find itself committed and skip the work): before the dashboards' day, whose
#: answers each run's commit still turns over (a new snapshot, a new cache).
BATCH_DAYS = (END - dt.timedelta(days=2), END - dt.timedelta(days=3))
_TICKS = os.sysconf("SC_CLK_TCK")


def main(events: int | None = None) -> dict[str, object]:
    events = events or DEFAULT_EVENTS
    with tempfile.TemporaryDirectory(prefix="ctr-bench-beside-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        print("bench beside-batch: the serving lake ...", flush=True)
        build_lake(lake)
        for day in BATCH_DAYS:
            print(f"bench beside-batch: {events:,} events of {day:%Y-%m-%d} ...", flush=True)
            generate_events(MASTER_EVENTS.path(lake), events, day=day)
        phases = _run(lake, dashboard_pages(), os.environ)
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "batch_nice": SparkSettings().batch_nice,
        "events": events,
        "users": USERS,
        "refresh_s": REFRESH_S,
        "phases": phases,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "beside-batch.json").write_text(json.dumps(results, indent=2) + "\n")
    print(_table(phases))
    return results


def _run(
    lake: LakeSettings, users: Sequence[Sequence[str]], environ: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    server, url, env = start_api_server(lake, environ, own_session=True)
    writer = SpeedWriter(lake, compact_every=60)
    phases: dict[str, dict[str, Any]] = {}
    try:
        wait_until_up(url, server)
        asyncio.run(_dashboards(url, users, _Timer(5.0)))  # warm-up
        writer.start()
        print(f"bench beside-batch: {USERS} users, no batch run, {QUIET_S:.0f} s ...", flush=True)
        phases["quiet"] = _phase(url, users, server.pid, lambda: _Timer(QUIET_S))
        # The lowered weight: SPARK_BATCH_NICE if the environment sets it, else the default.
        lowered = str(SparkSettings().batch_nice)
        runs = (("batch, nice 0", "0"), ("batch, lowered weight", lowered))
        for (name, nice), day in zip(runs, BATCH_DAYS, strict=True):
            print(f"bench beside-batch: {USERS} users beside `ctr batch` ({name}) ...", flush=True)
            batch_env = {**env, "SPARK_BATCH_NICE": nice}
            phases[name] = _phase(url, users, server.pid, functools.partial(_Batch, batch_env, day))
        print(f"bench beside-batch: {USERS} users, no batch run again ...", flush=True)
        phases["quiet, after"] = _phase(url, users, server.pid, lambda: _Timer(QUIET_S))
    finally:
        writer.stop.set()
        server.terminate()
        server.wait(timeout=30)
    return phases


class _Phase(Protocol):
    def running(self) -> bool: ...

    def finish(self) -> dict[str, float]: ...


class _Timer:
    """A phase that ends after a fixed time."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def finish(self) -> dict[str, float]:
        return {}


class _Batch:
    """A phase that lasts as long as a `ctr batch` of the whole day, in its own session (as
    Airflow's worker starts it: ``runtime.cpu_weight`` sets it apart)."""

    def __init__(self, env: Mapping[str, str], day: dt.datetime) -> None:
        self.cpu: dict[int, float] = {}  # by pid, the batch session's processes
        self.started = time.monotonic()
        self.ended: float | None = None
        start, end = day, day + dt.timedelta(days=1)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by finish)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import main; main()", "batch",
             "--start", f"{start:%Y-%m-%dT%H:%M}", "--end", f"{end:%Y-%m-%dT%H:%M}"],
            env={**env, "SPARK_UI_ENABLED": "false"},
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def running(self) -> bool:
        """Until :data:`AFTERMATH_S` after the run ended: its commit's new snapshot (every
        cached answer recomputed) belongs to its phase, not the next."""
        if self.ended is None:
            for pid, cpu in _session_cpu(self.process.pid).items():
                self.cpu[pid] = max(cpu, self.cpu.get(pid, 0.0))
            if self.process.poll() is not None:
                self.ended = time.monotonic()
        return self.ended is None or time.monotonic() < self.ended + AFTERMATH_S

    def finish(self) -> dict[str, float]:
        code = self.process.wait()
        self.log.seek(0)
        output = self.log.read().decode(errors="replace")
        self.log.close()
        if code != 0:
            raise RuntimeError(f"ctr batch failed ({code}):\n{output[-3000:]}")
        print(output[-600:], flush=True)
        assert self.ended is not None
        return {
            "batch_s": self.ended - self.started,
            "batch_cpu_s": sum(self.cpu.values()),
            "batch_ended": self.ended,
        }


def _phase(
    url: str, users: Sequence[Sequence[str]], api_pid: int, start: Callable[[], _Phase]
) -> dict[str, Any]:
    """The dashboards for as long as the phase runs; their latencies, the CPU each part used."""
    api_before, own_before = _process_cpu(api_pid), _own_cpu()
    started = time.monotonic()
    phase = start()
    load = asyncio.run(_dashboards(url, users, phase))
    elapsed = time.monotonic() - started
    figures = phase.finish()
    pages = {f"refresh_{k}": v for k, v in percentiles(load.pages).items()}
    ended = figures.pop("batch_ended", None)
    if ended is not None:  # while the run computed, and after its commit
        during = [took for began, took in load.timed if began < ended]
        after = [took for began, took in load.timed if began >= ended]
        for name, part in (("during", during), ("after_commit", after)):
            if len(part) >= 2:  # percentiles need two
                figures |= {f"{name}_{k}": v for k, v in percentiles(part).items()}
    return {
        **percentiles(load.requests),
        **pages,
        "requests": len(load.requests),
        "refreshes": len(load.pages),
        "errors": load.errors,
        "seconds": elapsed,
        # Where the time goes: each of the page's queries' median (three use reach).
        "p50_ms_by_query": {
            kind: statistics.median(took) * 1000 for kind, took in load.by_kind.items()
        },
        "api_cpu_s": _process_cpu(api_pid) - api_before,
        "load_cpu_s": _own_cpu() - own_before,
        **figures,
    }


@dataclass
class _Load:
    requests: list[float] = field(default_factory=list)  # seconds, each request
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # the same, per KINDS
    timed: list[tuple[float, float]] = field(default_factory=list)  # (began, seconds) each
    pages: list[float] = field(default_factory=list)  # seconds, each refresh (all answered)
    errors: int = 0


async def _dashboards(url: str, users: Sequence[Sequence[str]], phase: _Phase) -> _Load:
    import httpx

    load = _Load()
    limits = httpx.Limits(max_connections=len(PAGE_QUERIES))  # a browser's per-host six

    async def user(paths: Sequence[str]) -> None:
        async with httpx.AsyncClient(
            base_url=url, headers=AUTH, limits=limits, timeout=60.0
        ) as client:

            async def one(kind: str, path: str) -> None:
                began = time.monotonic()
                answer = await client.get(path)
                took = time.monotonic() - began
                load.requests.append(took)
                load.timed.append((began, took))
                load.by_kind.setdefault(kind, []).append(took)
                load.errors += answer.status_code != 200

            while phase.running():
                began = time.perf_counter()
                await asyncio.gather(*(one(k, p) for k, p in zip(KINDS, paths, strict=True)))
                load.pages.append(time.perf_counter() - began)
                await _sleep_while(phase, REFRESH_S)

    await asyncio.gather(*(user(paths) for paths in users))
    return load


async def _sleep_while(phase: _Phase, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while phase.running() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


def dashboard_pages(end: dt.datetime = END) -> list[list[str]]:
    """Each user's refresh: the page's six requests over its range, with its campaign filter."""
    from urllib.parse import urlencode

    campaigns = sorted(set(combos()["campaign_id"]))
    pages = []
    for number in range(USERS):
        length, granularity = RANGES[number % len(RANGES)]
        base = {
            "start": _iso(end - length),
            "end": _iso(end),
            **({"campaign_id": campaigns[number]} if number else {}),
        }
        pages.append(
            [f"/api/v1/ctr?{urlencode({**base, **query(granularity)})}" for query in PAGE_QUERIES]
        )
    return pages


def _iso(at: dt.datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _process_cpu(pid: int) -> float:
    """User and system CPU seconds of a running process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _session_cpu(sid: int) -> dict[int, float]:
    """The CPU seconds of every process of session ``sid`` (sampled while the phase runs: a
    process that ends between two samples loses what it used since the last, at most a load
    slice's 2 s; Spark's Python workers are reused, so few do)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended
            continue
        if int(fields[3]) == sid:  # the session id
            found[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    return found


def _own_cpu() -> float:
    return sum(os.times()[:2])


def _table(phases: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        f"{'phase':<22} {'req p50':>7} {'p99':>6} {'max':>6} {'refresh p99':>11} {'errors':>6} "
        f"{'API cpu-s':>9} {'batch cpu-s':>11} {'load cpu-s':>10} {'batch s':>7}  (ms)"
    ]
    for name, f in phases.items():
        lines.append(
            f"{name:<22} {f['p50_ms']:>7.0f} {f['p99_ms']:>6.0f} {f['max_ms']:>6.0f} "
            f"{f['refresh_p99_ms']:>11.0f} {f['errors']:>6.0f} {f['api_cpu_s']:>9.1f} "
            f"{f.get('batch_cpu_s', 0):>11.1f} {f['load_cpu_s']:>10.1f} {f.get('batch_s', 0):>7.0f}"
        )
    lines.append(
        "the batch phases' requests: while the run computed / the "
        f"{AFTERMATH_S:.0f} s after its commit, p50/p99 ms:"
    )
    for name, f in phases.items():
        if "during_p99_ms" in f and "after_commit_p99_ms" in f:
            lines.append(
                f"  {name:<22} {f['during_p50_ms']:.0f}/{f['during_p99_ms']:.0f}  /  "
                f"{f['after_commit_p50_ms']:.0f}/{f['after_commit_p99_ms']:.0f}"
            )
    lines.append("the page's queries, p50 ms (series, totals and table with reach):")
    for name, f in phases.items():
        by_kind = f["p50_ms_by_query"]
        lines.append(f"  {name:<22} " + "  ".join(f"{k} {v:.0f}" for k, v in by_kind.items()))
    return "\n".join(lines)
