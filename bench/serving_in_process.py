"""The serving benchmark's in-process measurements over one snapshot of its lake: the floors
(the dashboard query's SQL, and the mix's, in DuckDB from CLIENTS threads, uncached), and one
client's costs of the stale-arrivals branch, of an advertiser's scope, of reach, and of a key's
check.
"""

from __future__ import annotations

import datetime as dt
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from access.key_store import create_key
from bench.serving_lake import ADVERTISER_CAMPAIGNS, END, dashboard_params
from bench.serving_load import TOKEN, percentiles
from lake.settings import LakeSettings
from serving_layer.query import CtrQuery

if TYPE_CHECKING:
    from serving_layer.service import ServingLayer

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


def dashboard_query() -> CtrQuery:
    """The dashboard's default query (:func:`bench.serving_lake.dashboard_params`) as a value."""
    p = dashboard_params()
    return CtrQuery.create(
        start=dt.datetime.fromisoformat(p["start"]),
        end=dt.datetime.fromisoformat(p["end"]),
        granularity="hour",
        group_by=["campaign_id"],
    )


def dashboard_floor(lake: LakeSettings, duration_s: float, clients: int) -> dict[str, float]:
    """The same query's SQL in-process in DuckDB over the same snapshot, uncached."""
    from serving_layer.ctr_sql import ctr_sql
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    query = dashboard_query()
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
        **percentiles(latencies),
        "requests_per_s": len(latencies) / duration_s,
        "single_client_median_ms": statistics.median(single) * 1000,
        "rows": rows,
    }


def mix_floor(
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
        **percentiles(latencies),
        "requests_per_s": len(latencies) / duration_s,
        "requests": len(latencies),
        "single_client_median_ms": statistics.median(single) * 1000,
        "single_client_p99_ms": percentiles(single)["p99_ms"],
        "rows_p50": statistics.median(rows),
        "rows_max": max(rows),
        "empty_answers": sum(1 for n in rows if n == 0),
    }


def scope_cost(lake: LakeSettings, mix: Sequence[CtrQuery]) -> dict[str, float]:
    """The mix's SQL in-process over one snapshot, one client, each query as the admin asks it
    and as the advertiser does (its scope added), interleaved so both see the same state."""
    import dataclasses

    from access.roles import Scope
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

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
        "admin_p99_ms": percentiles(times["admin"])["p99_ms"],
        "advertiser_p99_ms": percentiles(times["advertiser"])["p99_ms"],
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


def reach_cost(lake: LakeSettings, repeats: int = 3) -> dict[str, dict[str, float]]:
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


def staleness_cost(lake: LakeSettings, repeats: int = 60) -> dict[str, float]:
    """The dashboard query's SQL from one client with the stale-arrivals branch and without it
    (medians, same process, alternating), and the stale table's computation."""
    from lake.coverage.staleness import stale_sql
    from serving_layer.ctr_sql import ctr_sql
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    snap = serving.reader.snapshot()
    query = dashboard_query()
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


def key_check_cost(lake: LakeSettings, repeats: int = 20_000) -> dict[str, float]:
    """What a request with a key pays before any route runs, in process: the store's check
    for a new commit (one stat) and the key's hash and lookup, against API_TOKEN's compare."""
    import secrets

    from access.key_watcher import KeyWatcher

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
