"""Serving benchmark: the dashboard query over HTTP with 32 concurrent clients, against DuckDB.

A realistic lake (24 h of minute buckets x a few hundred dimension combinations: batch/ctr
with coverage for the first 22 h, speed/ctr for the rest) is written with delta-rs. The API
server runs in a subprocess (uvicorn, one worker) while a writer commits to speed/ctr every
second, as the streaming job does, so snapshots keep changing. The dashboard query (last 24 h,
hourly, grouped by campaign) runs from 32 concurrent clients for 30 s: p50/p99 latency and
requests/s. Then the floor: the same query's SQL in-process in DuckDB over the same snapshot,
from 32 threads for the same time. Results go to bench/results/serving.json.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from infra.broker import free_port
from infra.lake import LakeSettings
from serving_layer.tables import SCHEMAS
from views import DIMENSIONS

END = dt.datetime(2026, 11, 22, 0, 0, tzinfo=dt.UTC)
HOURS = 24
COVERED_HOURS = 22
COMBOS = 300
CLIENTS = 32
DURATION_S = 30.0
RESULTS = Path("bench/results")
TOKEN = "bench-token-0123456789abcdef"


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
        table = minute_rows(at, 60, dims, seed=hour)
        table = table.append_column("run_id", pa.array([run_id] * len(table)))
        write_deltalake(lake.table("batch/ctr"), table.cast(SCHEMAS["batch/ctr"]), mode="append")
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
        table = table.append_column(
            "updated_at", pa.array([end] * len(table), pa.timestamp("us", tz="UTC"))
        )
        write_deltalake(lake.table("speed/ctr"), table.cast(SCHEMAS["speed/ctr"]), mode="append")
        rows += len(table)
    return rows
