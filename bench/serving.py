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
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from bench.serving_mix import (
    MIX_QUERIES,
    MIX_SEED,
    dashboard_mix,
    request_path,
    wrk_script,
)
from infra.broker import free_port
from lake.keys import create_key
from lake.settings import LakeSettings
from serving_layer.query import CtrQuery
from serving_layer.snapshots import SCHEMAS
from views.columns import DIMENSIONS

if TYPE_CHECKING:
    from serving_layer.service import ServingLayer

END = dt.datetime(2026, 11, 22, 0, 0, tzinfo=dt.UTC)
HOURS = 24
COVERED_HOURS = 22
COMBOS = 300
CLIENTS = 32
DURATION_S = 30.0
RESULTS = Path("bench/results")
TOKEN = "bench-token-0123456789abcdef"
# An advertiser's campaigns (of the 20 in the lake) for the runs with its key.
ADVERTISER_CAMPAIGNS: Final = ("cmp-003", "cmp-007", "cmp-011")
AUTH: Final = {"Authorization": f"Bearer {TOKEN}"}


def combos(n: int = COMBOS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    campaign = rng.integers(1, 21, n)
    return {
        "campaign_id": np.array([f"cmp-{c:03d}" for c in campaign]),
        "ad_id": np.array(
            [f"ad-{c:03d}-{a:02d}" for c, a in zip(campaign, rng.integers(1, 9, n), strict=True)]
        ),
        "site_id": np.array([f"site-{s:04d}" for s in rng.integers(1, 301, n)]),
        "country": rng.choice(["US", "DE", "GB", "FR", "JP", "BR", "IN", "CA"], n),
        "device_type": rng.choice(["mobile", "desktop", "tablet", "ctv", "other"], n),
    }


def minute_rows(
    start: dt.datetime, minutes: int, dims: dict[str, np.ndarray], seed: int
) -> pa.Table:
    """Every combination in every minute of [start, start + minutes)."""
    rng = np.random.default_rng(seed)
    n = len(dims["campaign_id"])
    base = int(start.timestamp() * 1_000_000)
    stamps = np.repeat(base + np.arange(minutes, dtype=np.int64) * 60_000_000, n)
    impressions = rng.poisson(40, n * minutes).astype(np.int64)
    clicks = rng.binomial(impressions, 0.03).astype(np.int64)
    columns: dict[str, pa.Array] = {
        "bucket_start": pa.array(stamps, pa.timestamp("us", tz="UTC")),
    }
    for name in DIMENSIONS:
        columns[name] = pa.array(np.tile(dims[name], minutes))
    columns["impressions"] = pa.array(impressions)
    columns["clicks"] = pa.array(clicks)
    return pa.table(columns)


USERS = 1_000_000  # the lake's audience: each impression's user drawn from it


def with_reach(table: pa.Table, seed: int, *, lists: bool) -> pa.Table:
    """``table``'s rows with who they reached, as the layers write it: a user per impression
    and per click drawn from :data:`USERS` (so rows share users), as sketches, and as sorted
    distinct lists when ``lists`` (batch rows)."""
    from views import sketches
    from views.columns import SKETCHES, USER_LISTS

    rng = np.random.default_rng(seed)
    for counts, list_name, sketch_name in zip(
        ("impressions", "clicks"), USER_LISTS, SKETCHES, strict=True
    ):
        n = table[counts].to_numpy()
        offsets = np.concatenate([[0], np.cumsum(n)])
        users = np.char.add("user-", rng.integers(0, USERS, int(offsets[-1])).astype(str))
        per_row = [np.unique(users[offsets[i] : offsets[i + 1]]).tolist() for i in range(len(n))]
        table = table.append_column(
            sketch_name, pa.array([sketches.sketch(u) for u in per_row], pa.binary())
        )
        if lists:
            table = table.append_column(list_name, pa.array(per_row, pa.list_(pa.string())))
    return table


def build_lake(lake: LakeSettings, *, end: dt.datetime = END) -> int:
    """batch/ctr hour by hour with coverage for the first COVERED_HOURS, speed/ctr for the
    last hour covered (not pruned yet) and the uncovered rest, in 1-minute commits' worth of
    files. Returns the rows written."""
    dims = combos()
    start = end - dt.timedelta(hours=HOURS)
    rows = 0
    for hour in range(COVERED_HOURS):
        at = start + dt.timedelta(hours=hour)
        run_id = f"run-{hour:02d}"
        table = with_reach(minute_rows(at, 60, dims, seed=hour), seed=hour, lists=True)
        table = table.append_column("run_id", pa.array([run_id] * len(table)))
        batch_schema = SCHEMAS["batch/ctr"]
        write_deltalake(
            lake.table("batch/ctr"),
            table.select(batch_schema.names).cast(batch_schema),
            mode="append",
        )
        coverage = pa.Table.from_pylist(
            [
                {
                    "run_id": run_id,
                    "view": "ctr",
                    "interval_start": at,
                    "interval_end": at + dt.timedelta(hours=1),
                    "input_version": hour,
                    "rows_written": len(table),
                    "finished_at": at + dt.timedelta(hours=1, minutes=5),
                }
            ],
            schema=SCHEMAS["batch/coverage"],
        )
        write_deltalake(lake.table("batch/coverage"), coverage, mode="append")
        rows += len(table)
    speed_start = start + dt.timedelta(hours=COVERED_HOURS - 1)
    for chunk in range(0, (HOURS - COVERED_HOURS + 1) * 60, 10):
        table = minute_rows(speed_start + dt.timedelta(minutes=chunk), 10, dims, seed=1000 + chunk)
        table = with_reach(table, seed=1000 + chunk, lists=False)
        table = table.append_column(
            "updated_at", pa.array([end] * len(table), pa.timestamp("us", tz="UTC"))
        )
        write_deltalake(lake.table("speed/ctr"), speed_rows(table), mode="append")
        rows += len(table)
    return rows


def speed_rows(table: pa.Table) -> pa.Table:
    """``table`` as speed/ctr rows: the attribution measures it lacks are null (not measured,
    as in a speed table written before version 3)."""
    schema = SCHEMAS["speed/ctr"]
    columns = [
        table[f.name] if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


STALE_MINUTES = int(COVERED_HOURS * 60 * 0.01)


def write_arrivals(lake: LakeSettings, *, end: dt.datetime = END) -> int:
    """master/arrivals as the archiver leaves it between batch runs: the arrivals of the uncovered
    hours (not covered, so not stale), and late arrivals in STALE_MINUTES covered minutes spread
    over the day (stale). Returns rows."""
    dims = combos()
    start = end - dt.timedelta(hours=HOURS)
    ts = pa.timestamp("us", tz="UTC")
    parts = []
    uncovered = (HOURS - COVERED_HOURS) * 60
    recent = minute_rows(start + dt.timedelta(hours=COVERED_HOURS), uncovered, dims, seed=5000)
    parts.append((recent, 10_000))
    for i in range(STALE_MINUTES):
        minute = start + dt.timedelta(minutes=i * (COVERED_HOURS * 60 // STALE_MINUTES) + 7)
        parts.append((minute_rows(minute, 1, dims, seed=6000 + i), 20_000))
    rows = 0
    for counts, version in parts:
        n = len(counts)
        table = (
            counts.append_column("events_version", pa.array([version] * n, pa.int64()))
            .append_column("batch_id", pa.array([version] * n, pa.int64()))
            .append_column("archived_at", pa.array([end] * n, ts))
        )
        write_deltalake(
            lake.table("master/arrivals"), table.cast(SCHEMAS["master/arrivals"]), mode="append"
        )
        rows += n
    return rows


def _staleness_cost(lake: LakeSettings, repeats: int = 60) -> dict[str, float]:
    """The dashboard query's SQL from one client with the stale-arrivals branch and without it
    (medians, same process, alternating), and the stale table's computation."""
    from lake.coverage.staleness import stale_sql
    from serving_layer.ctr_sql import ctr_sql
    from serving_layer.query import CtrQuery
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    p = dashboard_params()
    query = CtrQuery.create(
        start=dt.datetime.fromisoformat(p["start"]),
        end=dt.datetime.fromisoformat(p["end"]),
        granularity="hour",
        group_by=["campaign_id"],
    )
    within = serving.reader.coverage(snap).within(query.start, query.end)
    names = {**serving.reader.sides(snap), "covered": "unused"}
    arrivals = serving.reader.relation_name(snap["master/arrivals"])
    coverage = serving.reader.relation_name(snap["batch/coverage"])
    stale_rows = serving.ctr(query, snap)  # creates the stale table once
    timings: dict[str, list[float]] = {"without": [], "with": [], "stale_table": []}
    with serving.reader.cursor() as cur:
        stale = f"bench_stale_{arrivals}"
        batch = names["batch"]
        select = stale_sql(arrivals=arrivals, coverage=coverage, batch=batch)
        cur.execute(f"CREATE TABLE {stale} AS {select}")
        plain = ctr_sql(query, **names, intervals=within)
        merged = ctr_sql(query, **names, stale=stale, intervals=within)
        for _ in range(repeats):
            for key, (sql, params) in (("without", plain), ("with", merged)):
                started = time.perf_counter()
                cur.execute(sql, params).fetchall()
                timings[key].append(time.perf_counter() - started)
        for i in range(5):
            started = time.perf_counter()
            cur.execute(f"CREATE TABLE bench_stale_{i} AS {select}")
            timings["stale_table"].append(time.perf_counter() - started)
        stale_count = cur.execute(f"SELECT count(*) FROM {stale}").fetchone()
    serving.close()
    without = statistics.median(timings["without"]) * 1000
    with_stale = statistics.median(timings["with"]) * 1000
    return {
        "query_without_stale_ms": round(without, 2),
        "query_with_stale_ms": round(with_stale, 2),
        "ratio": round(with_stale / without, 3),
        "stale_table_ms": round(statistics.median(timings["stale_table"]) * 1000, 2),
        "stale_rows": int(stale_count[0]) if stale_count else 0,
        "stale_answer_rows": sum(1 for r in stale_rows.rows if r.source != "batch"),
    }


def dashboard_params(end: dt.datetime = END) -> dict[str, str]:
    start = end - dt.timedelta(hours=24)
    return {
        "start": start.isoformat().replace("+00:00", "Z"),
        "end": end.isoformat().replace("+00:00", "Z"),
        "granularity": "hour",
        "group_by": "campaign_id",
    }


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "max_ms": ordered[-1] * 1000}


class SpeedWriter(threading.Thread):
    """Commits a small speed/ctr batch every second (beyond the queried range), as the stream
    does, so the API keeps seeing new snapshot versions."""

    def __init__(self, lake: LakeSettings) -> None:
        super().__init__(daemon=True)
        self.lake = lake
        self.stop = threading.Event()
        self.commits = 0

    def run(self) -> None:
        dims = combos(20)
        while not self.stop.wait(1.0):
            table = minute_rows(
                END + dt.timedelta(minutes=self.commits), 1, dims, seed=self.commits
            )
            table = with_reach(table, seed=self.commits, lists=False)
            table = table.append_column(
                "updated_at", pa.array([END] * len(table), pa.timestamp("us", tz="UTC"))
            )
            write_deltalake(self.lake.table("speed/ctr"), speed_rows(table), mode="append")
            self.commits += 1


_WRK_UNITS: Final = {"us": 0.001, "ms": 1.0, "s": 1000.0}
WRK_THREADS: Final = 2
# wrk leaves a request slower than its timeout (default 2 s) out of the latencies; a slow
# answer must count, so the timeout is far above any p99 of interest.
WRK_TIMEOUT_S: Final = 30.0


def _wrk(
    url: str, duration_s: float, clients: int, paths: Sequence[str], token: str = TOKEN
) -> dict[str, float]:
    """The load from wrk (C, HdrHistogram percentiles): ``clients`` keep-alive connections on
    :data:`WRK_THREADS` threads sending requests back to back: the one path, or several in turn
    (a Lua script, :func:`bench.serving_mix.wrk_script`). Costs the shared two cores far less
    than a Python client, so the figures are the server's."""
    with tempfile.TemporaryDirectory(prefix="ctr-bench-wrk-") as scratch:
        target = [f"{url}{paths[0]}"]
        if len(paths) > 1:
            script = Path(scratch) / "mix.lua"
            script.write_text(wrk_script(paths, WRK_THREADS))
            target = ["-s", str(script), url]
        done = subprocess.run(
            ["wrk", f"-t{WRK_THREADS}", f"-c{clients}", f"-d{duration_s:.0f}s", "--latency",
             "--timeout", f"{WRK_TIMEOUT_S:.0f}s",
             "-H", f"Authorization: Bearer {token}", *target],
            capture_output=True, text=True, check=True, timeout=duration_s + 60,
        )  # fmt: skip
    out = done.stdout
    percentile = {
        m.group(1): float(m.group(2)) * _WRK_UNITS[m.group(3)]
        for m in re.finditer(r"^\s+(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    }
    requests = re.search(r"^\s*(\d+) requests in", out, re.MULTILINE)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.MULTILINE)
    if len(percentile) != 2 or requests is None or rate is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}\n{done.stderr}")
    maximum = re.search(r"^\s+Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out, re.MULTILINE)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.+)$", out, re.MULTILINE)
    socket_error_count = (
        sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1))) if socket_errors else 0
    )
    return {
        "p50_ms": percentile["50"],
        "p99_ms": percentile["99"],
        "max_ms": float(maximum.group(1)) * _WRK_UNITS[maximum.group(2)] if maximum else 0.0,
        "requests_per_s": float(rate.group(1)),
        "requests": int(requests.group(1)),
        "errors": (int(non_2xx.group(1)) if non_2xx else 0) + socket_error_count,
    }


async def _load(
    url: str, duration_s: float, clients: int, paths: Sequence[str], token: str = TOKEN
) -> tuple[list[float], int]:
    """``clients`` keep-alive connections sending ``paths`` in turn back to back, each from its
    own offset (an equal share apart), so that with several paths concurrent requests differ.
    An error: a status other than 200, or for a single path (the dashboard query) no rows.

    A minimal HTTP/1.1 client on asyncio streams: httpx's pool costs more CPU per request than
    the server does on a cache hit, and the load generator shares the machine's two cores.
    """
    import asyncio
    from urllib.parse import urlsplit

    target = urlsplit(url)
    requests = [
        f"GET {path} HTTP/1.1\r\nHost: {target.netloc}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
        for path in paths
    ]
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def worker(client: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(target.hostname, target.port)
        sent = client * len(requests) // clients
        try:
            while time.perf_counter() < deadline:
                request = requests[sent % len(requests)]
                sent += 1
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
                if not head.startswith(b"HTTP/1.1 200") or (
                    len(requests) == 1 and b'"rows":[{' not in body
                ):
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker(client) for client in range(clients)))
    return latencies, errors


Statement = tuple[str, dict[str, object]]


def _closed_loop(
    serving: ServingLayer, statements: Sequence[Statement], duration_s: float, clients: int
) -> list[float]:
    """Latencies of ``clients`` threads running ``statements`` in turn back to back for
    ``duration_s``, each from its own offset (an equal share apart), each on its own cursor."""
    latencies: list[float] = []
    deadline = time.perf_counter() + duration_s

    def worker(client: int) -> None:
        done = client * len(statements) // clients
        with serving.reader.cursor() as cur:
            while time.perf_counter() < deadline:
                sql, params = statements[done % len(statements)]
                done += 1
                started = time.perf_counter()
                cur.execute(sql, params).fetchall()
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker, args=(client,)) for client in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def _floor(lake: LakeSettings, duration_s: float, clients: int) -> dict[str, float]:
    """The same query's SQL in-process in DuckDB over the same snapshot, uncached."""
    from serving_layer.ctr_sql import ctr_sql
    from serving_layer.query import CtrQuery
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    p = dashboard_params()
    query = CtrQuery.create(
        start=dt.datetime.fromisoformat(p["start"]),
        end=dt.datetime.fromisoformat(p["end"]),
        granularity="hour",
        group_by=["campaign_id"],
    )
    coverage = serving.reader.coverage(snap)
    sql, params = ctr_sql(
        query,
        **serving.reader.sides(snap),
        covered="unused",
        intervals=coverage.within(query.start, query.end),
    )
    rows = len(serving.ctr(query, snap).rows)
    single: list[float] = []
    with serving.reader.cursor() as cur:
        for _ in range(20):
            started = time.perf_counter()
            cur.execute(sql, params).fetchall()
            single.append(time.perf_counter() - started)
    latencies = _closed_loop(serving, [(sql, params)], duration_s, clients)
    serving.close()
    return {
        **_percentiles(latencies),
        "requests_per_s": len(latencies) / duration_s,
        "single_client_median_ms": statistics.median(single) * 1000,
        "rows": rows,
    }


def _mix_floor(
    lake: LakeSettings, mix: Sequence[CtrQuery], duration_s: float, clients: int
) -> dict[str, float]:
    """The mix's SQL in-process in DuckDB over one snapshot, uncached: ``clients`` threads,
    each walking the mix from its own offset (an equal share apart), for ``duration_s``. Also
    one client's median over one pass, and the rows per answer."""
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    view = serving.reader.definition(snap)
    statements = [serving.ctr_statement(query, snap, view) for query in mix]
    single: list[float] = []
    rows: list[int] = []
    with serving.reader.cursor() as cur:
        for sql, params in statements:
            started = time.perf_counter()
            rows.append(len(cur.execute(sql, params).fetchall()))
            single.append(time.perf_counter() - started)
    latencies = _closed_loop(serving, statements, duration_s, clients)
    serving.close()
    return {
        **_percentiles(latencies),
        "requests_per_s": len(latencies) / duration_s,
        "requests": len(latencies),
        "single_client_median_ms": statistics.median(single) * 1000,
        "single_client_p99_ms": _percentiles(single)["p99_ms"],
        "rows_p50": statistics.median(rows),
        "rows_max": max(rows),
        "empty_answers": sum(1 for n in rows if n == 0),
    }


def _scope_cost(lake: LakeSettings, mix: Sequence[CtrQuery]) -> dict[str, float]:
    """The mix's SQL in-process over one snapshot, one client, each query as the admin asks it
    and as the advertiser does (its scope added), interleaved so both see the same state."""
    import dataclasses

    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer
    from views.access import Scope

    scope = Scope.create(ADVERTISER_CAMPAIGNS)
    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    view = serving.reader.definition(snap)
    times: dict[str, list[float]] = {"admin": [], "advertiser": []}
    rows: dict[str, int] = {"admin": 0, "advertiser": 0}
    with serving.reader.cursor() as cur:
        for query in mix:
            for who, asked in (
                ("admin", query),
                ("advertiser", dataclasses.replace(query, scope=scope)),
            ):
                sql, params = serving.ctr_statement(asked, snap, view)
                started = time.perf_counter()
                rows[who] += len(cur.execute(sql, params).fetchall())
                times[who].append(time.perf_counter() - started)
    serving.close()
    admin, advertiser = (statistics.median(times[w]) * 1000 for w in ("admin", "advertiser"))
    return {
        "admin_median_ms": admin,
        "advertiser_median_ms": advertiser,
        "admin_p99_ms": _percentiles(times["admin"])["p99_ms"],
        "advertiser_p99_ms": _percentiles(times["advertiser"])["p99_ms"],
        "median_ratio": advertiser / admin,
        "admin_rows": rows["admin"],
        "advertiser_rows": rows["advertiser"],
    }


# The dashboard's queries that ask for reach, over the lake's day (the range's end is END).
REACH_QUERIES: Final[Mapping[str, Mapping[str, str | int]]] = {
    "the day per hour (the dashboard's series)": {"granularity": "hour", "hours": 24},
    "the day's total (the dashboard's totals)": {"granularity": "all", "hours": 24},
    "the day per hour and campaign": {
        "granularity": "hour",
        "hours": 24,
        "group_by": "campaign_id",
    },
    "the last hour per minute (speed rows: estimates)": {"granularity": "minute", "hours": 1},
    "6 hours per minute and country": {"granularity": "minute", "hours": 6, "group_by": "country"},
}


def _reach_cost(lake: LakeSettings, repeats: int = 3) -> dict[str, dict[str, float]]:
    """Each of REACH_QUERIES in-process over one snapshot, one client, without reach and with
    it (reach=true: the distinct counts of the batch rows' user lists and the sketches'
    unions), interleaved; the better of ``repeats`` runs each, ms."""
    import dataclasses

    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    costs = {}
    for name, shape in REACH_QUERIES.items():
        query = CtrQuery.create(
            start=END - dt.timedelta(hours=int(shape["hours"])),
            end=END,
            granularity=str(shape["granularity"]),
            group_by=[str(shape["group_by"])] if "group_by" in shape else [],
        )
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for reach in (False, True):
                started = time.perf_counter()
                serving.ctr(dataclasses.replace(query, reach=reach), snap)
                times[reach].append(time.perf_counter() - started)
        costs[name] = {
            "without_ms": min(times[False]) * 1000,
            "with_ms": min(times[True]) * 1000,
        }
    serving.close()
    return costs


def _wait_until_up(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("the API server did not start")
        time.sleep(0.2)


def _api_load(
    url: str, duration_s: float, paths: Sequence[str], token: str = TOKEN
) -> tuple[str, dict[str, float]]:
    """(load generator, its figures) for ``paths`` sent in turn with the bearer ``token``: wrk
    if installed, else the Python client."""
    import asyncio

    if shutil.which("wrk"):
        return "wrk", _wrk(url, duration_s, CLIENTS, paths, token)
    print("bench serving: no wrk (make bench installs it); a Python client")
    latencies, errors = asyncio.run(_load(url, duration_s, CLIENTS, paths, token))
    return "python asyncio", {
        **_percentiles(latencies),
        "requests_per_s": len(latencies) / duration_s,
        "requests": len(latencies),
        "errors": errors,
    }


def _cache_metrics(metrics: str) -> dict[str, float]:
    """The API's response-cache counters from its Prometheus text."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("ctr_api_cache_") and "_created" not in line and "#" not in line:
            name, value = line.split()
            found[name.removeprefix("ctr_api_")] = float(value)
    return found


def _cache_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The response cache's counters over a run, and its hit rate: answers served from the
    cache (current, stale, or waiting on a computation another request started) per request."""
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    served = delta.get("cache_hits_total", 0.0) + delta.get("cache_stale_hits_total", 0.0)
    requests = served + delta.get("cache_misses_total", 0.0)
    return {**delta, "cache_hit_rate": served / requests if requests else 0.0}


@dataclass
class _ApiRuns:
    load_generator: str
    single: dict[str, float]
    mix: dict[str, float]
    speed_commits: int
    # The same two runs with an advertiser's key (ADVERTISER_CAMPAIGNS).
    advertiser_single: dict[str, float]
    advertiser_mix: dict[str, float]
    admin_mix_after: dict[str, float]


def _run_api(lake: LakeSettings, duration: float, mix_paths: Sequence[str]) -> _ApiRuns:
    """The API server in a subprocess while the writer commits every second: the dashboard query
    from CLIENTS clients, then the mix, the cache counters read around each."""
    import asyncio

    import httpx

    port = free_port()
    env = {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "API_TOKEN": TOKEN,
        "API_PORT": str(port),
    }
    server = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "serve"], env=env
    )
    writer = SpeedWriter(lake)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, server)
        asyncio.run(_load(url, 2.0, CLIENTS, [dashboard_path()]))  # warm-up
        writer.start()
        print(f"bench serving: {CLIENTS} clients for {duration:.0f} s ...", flush=True)
        load_generator, single = _api_load(url, duration, [dashboard_path()])
        checked = httpx.get(f"{url}/api/v1/ctr", params=dashboard_params(),
                            headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        if checked.status_code != 200 or not checked.json()["rows"]:
            raise RuntimeError(f"the dashboard query failed: {checked.text[:500]}")
        before = _cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        single.update(before)
        print(
            f"bench serving: {len(mix_paths)} distinct queries, {CLIENTS} clients for "
            f"{duration:.0f} s ...",
            flush=True,
        )
        _, mix = _api_load(url, duration, mix_paths)
        after = _cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        mix.update(_cache_delta(before, after))
        # The same, with an advertiser's key: each answer computed over its campaigns only.
        # The lake's minutes are a fixed day's (END): its campaigns may be older than 30 days.
        _, key = create_key(
            lake,
            "bench-advertiser",
            "advertiser",
            campaigns=ADVERTISER_CAMPAIGNS,
            allow_unknown=True,
        )
        asyncio.run(_load(url, 2.0, CLIENTS, [dashboard_path()], key))  # warm-up
        print(f"bench serving: an advertiser's key, {CLIENTS} clients ...", flush=True)
        _, advertiser_single = _api_load(url, duration, [dashboard_path()], key)
        scoped = httpx.get(f"{url}/api/v1/ctr", params=dashboard_params(),
                           headers={"Authorization": f"Bearer {key}"}).json()  # fmt: skip
        if {r["campaign_id"] for r in scoped["rows"]} != set(ADVERTISER_CAMPAIGNS):
            raise RuntimeError(f"the advertiser's answer is not its scope's: {scoped}")
        before = _cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        _, advertiser_mix = _api_load(url, duration, mix_paths, key)
        after = _cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        advertiser_mix.update(_cache_delta(before, after))
        # The admin's mix once more: the lake grew meanwhile (a speed commit a second), so the
        # advertiser's runs are bracketed by two of the admin's.
        print("bench serving: the admin's mix again ...", flush=True)
        _, admin_mix_after = _api_load(url, duration, mix_paths)
        writer.stop.set()
        writer.join()
    finally:
        writer.stop.set()
        server.terminate()
        server.wait(timeout=30)
    single["speed_commits_during_run"] = writer.commits
    return _ApiRuns(
        load_generator,
        single,
        mix,
        writer.commits,
        advertiser_single,
        advertiser_mix,
        admin_mix_after,
    )


def main(events: int | None = None) -> dict[str, object]:
    """``events`` is ignored (the lake's size is fixed: 24 h x COMBOS combinations)."""
    duration = float(os.environ.get("BENCH_SERVING_SECONDS", DURATION_S))
    values = {name: [str(v) for v in column] for name, column in combos().items()}
    mix = dashboard_mix(MIX_QUERIES, values=values, start=END - dt.timedelta(hours=HOURS), end=END)
    mix_paths = [request_path(query) for query in mix]
    with tempfile.TemporaryDirectory(prefix="ctr-bench-serving-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        print("bench serving: writing the lake ...", flush=True)
        rows = build_lake(lake)
        arrival_rows = write_arrivals(lake)
        runs = _run_api(lake, duration, mix_paths)
        print(f"bench serving: the floor, in-process DuckDB, {CLIENTS} threads ...", flush=True)
        floor = _floor(lake, duration, CLIENTS)
        print(f"bench serving: the mix's floor, {CLIENTS} threads ...", flush=True)
        mix_floor = _mix_floor(lake, mix, duration, CLIENTS)
        print("bench serving: the cost of the stale-arrivals branch, one client ...", flush=True)
        staleness = _staleness_cost(lake)
        key_check = _key_check_cost(lake)
        print("bench serving: the mix with and without a scope, one client ...", flush=True)
        scope_cost = _scope_cost(lake, mix)
        print("bench serving: reach, the dashboard's queries with and without it ...", flush=True)
        reach_cost = _reach_cost(lake)
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


def _advertiser_line(runs: _ApiRuns, api: Mapping[str, float], mix_api: Mapping[str, float]) -> str:
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


def _key_check_cost(lake: LakeSettings, repeats: int = 20_000) -> dict[str, float]:
    """What a request with a key pays before any route runs, in process: the store's check
    for a new commit (one stat) and the key's hash and lookup, against API_TOKEN's compare."""
    import secrets

    from lake.keys import KeyWatcher

    watcher = KeyWatcher(lake)
    _, key = create_key(
        lake, "bench-key-check", "advertiser", campaigns=ADVERTISER_CAMPAIGNS, allow_unknown=True
    )
    now = dt.datetime.now(dt.UTC)
    assert watcher.ring().verify(key, now) is not None
    started = time.perf_counter()
    for _ in range(repeats):
        watcher.ring().verify(key, now)
    key_us = (time.perf_counter() - started) / repeats * 1e6
    started = time.perf_counter()
    for _ in range(repeats):
        secrets.compare_digest(key.encode(), TOKEN.encode())
    token_us = (time.perf_counter() - started) / repeats * 1e6
    return {"key_check_us": key_us, "api_token_check_us": token_us, "reloads": watcher.reloads}


def _mix_shape(mix: Sequence[CtrQuery]) -> dict[str, dict[str, int]]:
    """How many of the mix's queries have each granularity, split, filter count, and top-N."""
    return {
        "granularity": dict(Counter(q.granularity for q in mix)),
        "group_by_dimensions": dict(Counter(str(len(q.group_by)) for q in mix)),
        "filtered_dimensions": dict(Counter(str(len(q.filters)) for q in mix)),
        "top_n": dict(Counter("yes" if q.order_by else "no" for q in mix)),
    }


def dashboard_path() -> str:
    """The dashboard query as a request path."""
    from urllib.parse import urlencode

    return f"/api/v1/ctr?{urlencode(dashboard_params())}"
