"""A small SQL query over PostgreSQL's wire protocol against the same query over
``POST /api/v1/sql`` (issue 72: within 1.5 times).

``ctr serve`` with ``API_PG_PORT`` in a subprocess over the serving benchmark's lake (a day of
300 dimension combinations a minute: batch hours with coverage, the last hours from the speed
layer); one client at a time asks, in turns, over HTTP (httpx, keep-alive, the values written
into the SQL) and over the wire (psycopg 3, one connection, the values bound as parameters), each
of three small queries a dashboard or a notebook sends: the top campaigns of an hour of the
merged view, one campaign's clicks by hour with a bound id, the coverage of the day. Warm-up
rounds first; the figure is each side's p50 and p95 over the same rounds, the ratio p50 over p50.

Where the time goes: the sandbox's own time per query (the worker's, ``Ctr-Elapsed-Ms``) is
measured over HTTP and is the same work on both sides; the rest is each protocol's own.

``python -m bench sql-wire`` (``--events`` is ignored; rounds: ``SQL_WIRE_ROUNDS``, 100).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import httpx
import psycopg

from bench.serving_api import start_api_server
from bench.serving_lake import END, build_lake
from bench.serving_load import AUTH, TOKEN, wait_until_up
from bench.state_report import percentile
from infra.broker import free_port
from lake.settings import LakeSettings

RESULTS: Final = Path("bench/results")
HOUR: Final = (END - dt.timedelta(hours=3)).isoformat()
QUERIES: Final = {
    "top campaigns of an hour": (
        "SELECT campaign_id, sum(clicks) AS clicks, sum(impressions) AS impressions "
        "FROM ctr WHERE bucket_start >= CAST({0} AS TIMESTAMPTZ) "
        "AND bucket_start < CAST({0} AS TIMESTAMPTZ) + INTERVAL 1 HOUR "
        "GROUP BY campaign_id ORDER BY clicks DESC LIMIT 10",
        (HOUR,),
    ),
    "one campaign by hour": (
        "SELECT date_trunc('hour', bucket_start) AS hour, sum(clicks) AS clicks "
        "FROM ctr WHERE campaign_id = {0} GROUP BY 1 ORDER BY 1",
        ("cmp-007",),
    ),
    "the day's coverage": (
        "SELECT count(*) AS runs, min(interval_start) AS first, max(interval_end) AS last "
        "FROM coverage WHERE interval_start >= CAST({0} AS TIMESTAMPTZ) - INTERVAL 1 DAY",
        (END.isoformat(),),
    ),
}


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def main(events: int | None = None) -> None:
    #: Rounds of each query per protocol in `python -m bench sql-wire` (after 10 warm-up rounds).
    rounds = int(os.environ.get("SQL_WIRE_ROUNDS", "100"))
    warmup = 10
    with tempfile.TemporaryDirectory(prefix="bench-sql-wire-") as root:
        lake = LakeSettings(lake_root=f"{root}/lake", checkpoint_root=f"{root}/checkpoints")
        started = time.monotonic()
        rows = build_lake(lake)
        print(f"sql-wire: lake of {rows:,} rows in {time.monotonic() - started:.0f} s", flush=True)
        pg_port = free_port()
        server, url, _ = start_api_server(lake, {**os.environ, "API_PG_PORT": str(pg_port)})
        try:
            wait_until_up(url, server)
            results = _measure(url, pg_port, rounds=rounds, warmup=warmup)
        finally:
            server.terminate()
            server.wait(timeout=30)
    results["rows"] = rows
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sql-wire.json").write_text(json.dumps(results, indent=2) + "\n")
    _print(results)


def _measure(url: str, pg_port: int, *, rounds: int, warmup: int) -> dict[str, Any]:
    http_ms: dict[str, list[float]] = {name: [] for name in QUERIES}
    worker_ms: dict[str, list[float]] = {name: [] for name in QUERIES}
    wire_ms: dict[str, list[float]] = {name: [] for name in QUERIES}
    same = True
    dsn = f"host=127.0.0.1 port={pg_port} dbname=ctr user=bench password={TOKEN}"
    with (
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as http,
        psycopg.connect(dsn, autocommit=True) as wire,
    ):
        for round_ in range(warmup + rounds):
            for name, (template, values) in QUERIES.items():
                sql = template.format(*(_literal(v) for v in values))
                began = time.perf_counter()
                response = http.post("/api/v1/sql", json={"sql": sql}, params={"format": "csv"})
                took_http = (time.perf_counter() - began) * 1000
                response.raise_for_status()
                began = time.perf_counter()
                bound = template.format(*(f"%(p{i})s" for i in range(len(values))))
                named = {f"p{i}": v for i, v in enumerate(values)}
                answer = wire.execute(bound, named).fetchall()
                took_wire = (time.perf_counter() - began) * 1000
                if round_ < warmup:
                    if round_ == 0:
                        same &= len(response.text.strip().splitlines()) - 1 == len(answer)
                    continue
                http_ms[name].append(took_http)
                wire_ms[name].append(took_wire)
                worker_ms[name].append(float(response.headers["Ctr-Elapsed-Ms"]))
    every_http = [v for values in http_ms.values() for v in values]
    every_wire = [v for values in wire_ms.values() for v in values]
    return {
        "rounds": rounds,
        "same_row_counts": same,
        "queries": {
            name: {
                "http_p50_ms": statistics.median(http_ms[name]),
                "http_p95_ms": percentile(http_ms[name], 0.95),
                "wire_p50_ms": statistics.median(wire_ms[name]),
                "wire_p95_ms": percentile(wire_ms[name], 0.95),
                "worker_p50_ms": statistics.median(worker_ms[name]),
            }
            for name in QUERIES
        },
        "http_p50_ms": statistics.median(every_http),
        "http_p95_ms": percentile(every_http, 0.95),
        "wire_p50_ms": statistics.median(every_wire),
        "wire_p95_ms": percentile(every_wire, 0.95),
        "ratio_p50": statistics.median(every_wire) / statistics.median(every_http),
    }


def _print(r: dict[str, Any]) -> None:
    print(f"sql-wire: {r['rounds']} rounds of each query, one client, in turns")
    print(f"  {'query':28} {'HTTP p50/p95 ms':>18} {'wire p50/p95 ms':>18} {'worker p50':>11}")
    for name, q in r["queries"].items():
        print(
            f"  {name:28} {q['http_p50_ms']:8.1f}/{q['http_p95_ms']:<8.1f} "
            f"{q['wire_p50_ms']:8.1f}/{q['wire_p95_ms']:<8.1f} {q['worker_p50_ms']:10.1f}"
        )
    print(
        f"  all: HTTP p50 {r['http_p50_ms']:.1f} ms, wire p50 {r['wire_p50_ms']:.1f} ms: "
        f"{r['ratio_p50']:.2f}× (goal ≤ 1.5×); same row counts: {r['same_row_counts']}"
    )
