"""Passes benchmark: each periodic pass over the lake, timed on a lake of a few days and on the
same lake grown 10x (the issue's goal: the larger costs at most 1.5x the smaller).

A lake of ``days`` days is built with delta-rs (no Spark): ``batch/ctr`` as a batch run leaves
it (an hour file per hour, ``HOUR_ROWS`` rows each, a commit per hour), ``master/events`` (a
day's events in one compacted file per ``event_date``), ``batch/coverage`` (a run per day,
compacted).
Then, three times, the activity of one maintenance period lands and each pass runs once,
timed alone:

- ``ctr_maintenance`` on ``batch/ctr``, after a batch run replaced the last two hours (its
  regular pass: lite VACUUM where the code has one; the day's full pass is timed apart);
- the archiver's maintenance of ``master/events``, after 20 micro-batches appended a small file
  each to today's partition (its regular pass; the full VACUUM apart);
- the staleness check (``read_stale``) with 200 arrivals in the last two hours and one late
  event of the lake's first day;
- the replay's start (``replayed_since``: the earliest ingest time the replayed log holds).

The figure of a pass is the median of its three runs. Written against the functions every
version since before issue 48 has, so the same script gives the before and the after.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from events.records import EVENTS_SCHEMA
from lake.append_table import AppendTable
from lake.catalog import BATCH_CTR, MASTER_ARRIVALS, MASTER_EVENTS
from lake.coverage import log as coverage_log
from lake.coverage.model import CoverageRun
from lake.coverage.staleness import read_stale
from lake.maintenance import compact_and_vacuum
from lake.settings import LakeSettings
from workflows.build import replayed_since

SMALL_DAYS = 3
GROWTH = 10
HOUR_ROWS = 4_000
DAY_EVENTS = 40_000
REPEATS = 3
GOAL = 1.5
LAST_DAY = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
RESULTS = Path("bench/results")


def main(events: int | None = None) -> dict[str, object]:
    del events  # the lake's size is the benchmark's own (SMALL_DAYS, then GROWTH times more)
    figures: dict[str, dict[str, float]] = {}
    for days in (SMALL_DAYS, SMALL_DAYS * GROWTH):
        with tempfile.TemporaryDirectory(prefix="ctr-bench-passes-") as scratch:
            lake = LakeSettings(
                lake_root=Path(scratch) / "lake",
                checkpoint_root=Path(scratch) / "ck",
                vacuum_retention_hours=1 / 60,
            )
            print(f"bench passes: building a lake of {days} days ...", flush=True)
            _build(lake, days)
            figures[f"{days}d"] = _measure(lake, days)
    small, large = figures[f"{SMALL_DAYS}d"], figures[f"{SMALL_DAYS * GROWTH}d"]
    ratios = {name: round(large[name] / max(small[name], 1e-6), 2) for name in small}
    print(f"bench passes: median of {REPEATS} passes each, ms ({SMALL_DAYS} days -> "
          f"{SMALL_DAYS * GROWTH} days; goal <= x{GOAL} for the regular passes):")  # fmt: skip
    for name in small:
        print(f"  {small[name] * 1000:8.1f} -> {large[name] * 1000:8.1f} ms  x{ratios[name]:5.2f}"
              f"  {name}")  # fmt: skip
    outcome: dict[str, object] = {
        "benchmark": "passes",
        "days": [SMALL_DAYS, SMALL_DAYS * GROWTH],
        "seconds": figures,
        "ratios": ratios,
        "goal": f"<= x{GOAL}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "passes.json").write_text(json.dumps(outcome, indent=2) + "\n")
    return outcome


def _build(lake: LakeSettings, days: int) -> None:
    first = LAST_DAY - dt.timedelta(days=days - 1)
    for n in range(days):
        day = first + dt.timedelta(days=n)
        for hour in range(24):
            _append_batch_hour(lake, day + dt.timedelta(hours=hour), f"run-{n}")
        write_deltalake(
            MASTER_EVENTS.path(lake),
            _events(day, DAY_EVENTS, seed=n),
            mode="append",
            partition_by=list(MASTER_EVENTS.partition_by),
            configuration=lake.retention(MASTER_EVENTS.name) if n == 0 else None,
        )
        coverage_log.record(
            lake, CoverageRun(f"run-{n}", "ctr", day, day + dt.timedelta(days=1), 1, 0, day)
        )
    # batch/coverage as the daily maintenance leaves it (a file, not one per run).
    compact_and_vacuum(lake, "batch/coverage")


def _append_batch_hour(
    lake: LakeSettings, hour: dt.datetime, run_id: str, *, replace: bool = False
) -> None:
    rng = np.random.default_rng(int(hour.timestamp()))
    minutes = rng.integers(0, 60, HOUR_ROWS)
    columns: dict[str, pa.Array] = {
        name: pa.nulls(HOUR_ROWS, field.type) for name, field in zip(
            BATCH_CTR.schema.names, BATCH_CTR.schema, strict=True)
    }  # fmt: skip
    stamps = int(hour.timestamp() * 1e6) + minutes * 60_000_000
    columns["bucket_start"] = pa.array(np.sort(stamps), pa.timestamp("us", tz="UTC"))
    for name in ("campaign_id", "ad_id", "site_id", "country", "device_type"):
        columns[name] = pa.array([f"{name}-{v}" for v in rng.integers(0, 50, HOUR_ROWS)])
    columns["impressions"] = pa.array(rng.integers(1, 100, HOUR_ROWS))
    columns["clicks"] = pa.array(rng.integers(0, 3, HOUR_ROWS))
    columns["run_id"] = pa.array([run_id] * HOUR_ROWS)
    rows = pa.table(columns).cast(BATCH_CTR.schema)
    path = BATCH_CTR.path(lake)
    if replace:
        end = hour + dt.timedelta(hours=1)
        write_deltalake(path, rows, mode="overwrite",
                        predicate=f"bucket_start >= '{hour.isoformat()}' AND "
                                  f"bucket_start < '{end.isoformat()}'")  # fmt: skip
    else:
        write_deltalake(path, rows, mode="append", configuration=lake.retention(BATCH_CTR.name))


def _events(day: dt.datetime, n: int, *, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    start = int(day.timestamp() * 1e6)
    when = np.sort(start + rng.integers(0, 86_400_000_000, n))
    strings = {
        name: pa.array([f"{name}-{v}" for v in rng.integers(0, 50, n)])
        for name in ("ad_id", "campaign_id", "site_id", "country", "device_type", "user_id")
    }
    ids = [f"{seed}-{i}" for i in range(n)]
    return (
        pa.table(
            {
                "event_id": pa.array(ids),
                "event_type": pa.array(np.where(rng.random(n) < 0.02, "click", "impression")),
                "event_time": pa.array(when, pa.timestamp("us", tz="UTC")),
                "impression_id": pa.array(ids),
                **strings,
                "schema_version": pa.array(np.ones(n, np.int32)),
                "event_date": pa.array(np.full(n, day.date())),
                "kafka_partition": pa.array(np.zeros(n, np.int32)),
                "kafka_offset": pa.array(np.arange(n, dtype=np.int64)),
                "ingest_time": pa.array(when + 1000, pa.timestamp("us", tz="UTC")),
            }
        )
        .select(EVENTS_SCHEMA.names)
        .cast(EVENTS_SCHEMA)
    )


def _arrivals(lake: LakeSettings, days: int, repeat: int) -> None:
    """200 arrivals in the last two hours and one of the lake's first day, all later than the
    coverage's master/events version (so stale)."""
    first = LAST_DAY - dt.timedelta(days=days - 1)
    last = LAST_DAY + dt.timedelta(hours=22)
    buckets = [last + dt.timedelta(minutes=m % 120) for m in range(200)] + [first]
    n = len(buckets)
    columns: dict[str, pa.Array] = {}
    for field in MASTER_ARRIVALS.schema:
        columns[field.name] = pa.nulls(n, field.type)
    columns["bucket_start"] = pa.array(buckets, pa.timestamp("us", tz="UTC"))
    for name in ("campaign_id", "ad_id", "site_id", "country", "device_type"):
        columns[name] = pa.array([f"{name}-{m % 50}" for m in range(n)])
    for name in ("impressions", "clicks"):
        columns[name] = pa.array([1] * n, pa.int64())
    columns["events_version"] = pa.array([100 + repeat] * n, pa.int64())
    columns["batch_id"] = pa.array([repeat] * n, pa.int64())
    columns["archived_at"] = pa.array([last] * n, pa.timestamp("us", tz="UTC"))
    write_deltalake(
        MASTER_ARRIVALS.path(lake),
        pa.table(columns).cast(MASTER_ARRIVALS.schema),
        mode="append",
        configuration=lake.retention(MASTER_ARRIVALS.name),
    )


def _timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _accepts(function: Callable[..., object], name: str) -> bool:
    return name in inspect.signature(function).parameters


def _measure(lake: LakeSettings, days: int) -> dict[str, float]:
    events = AppendTable(
        MASTER_EVENTS.path(lake),
        lake.object_store,
        EVENTS_SCHEMA,
        partition_by=MASTER_EVENTS.partition_by,
        properties=lake.retention(MASTER_EVENTS.name),
    )
    # The regular passes, as each version of the code runs them between two full ones.
    lite_dag = {"full_vacuum": False} if _accepts(compact_and_vacuum, "full_vacuum") else {}
    lite_archiver = {"full_vacuum": False} if _accepts(events.maintain, "full_vacuum") else {}
    runs: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        runs.setdefault(name, []).append(seconds)

    for repeat in range(REPEATS):
        for hour in (22, 23):  # a batch run replaced the day's last two hours
            _append_batch_hour(lake, LAST_DAY + dt.timedelta(hours=hour), f"re-{repeat}",
                               replace=True)  # fmt: skip
        for n in range(20):  # 20 micro-batches of today's events
            write_deltalake(
                MASTER_EVENTS.path(lake),
                _events(LAST_DAY, 200, seed=1000 * (repeat + 1) + n),
                mode="append",
                partition_by=list(MASTER_EVENTS.partition_by),
            )
        _arrivals(lake, days, repeat)
        record("ctr_maintenance pass on batch/ctr",
               _timed(lambda: compact_and_vacuum(lake, "batch/ctr", **lite_dag)))  # fmt: skip
        record("archiver maintenance pass on master/events",
               _timed(lambda: events.maintain(**lite_archiver)))  # fmt: skip
        record("staleness check (read_stale)", _timed(lambda: read_stale(lake)))
        record("replay start (replayed_since)", _timed(lambda: replayed_since(lake)))
    record("full VACUUM of batch/ctr (daily)",
           _timed(lambda: compact_and_vacuum(lake, "batch/ctr")))  # fmt: skip
    record("full VACUUM of master/events (daily)", _timed(events.maintain))
    medians = {name: statistics.median(seconds) for name, seconds in runs.items()}
    for name, seconds in medians.items():
        print(f"  {seconds * 1000:8.1f} ms  {name} ({days} days)", flush=True)
    return medians
