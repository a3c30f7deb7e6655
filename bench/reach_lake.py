"""The reach benchmark's lake of realistic cardinality (issue 69): a day of ad events shaped
like real traffic, where nearly every few events make a combination of dimensions of their own.

:func:`build_realistic_lake` draws :data:`EVENTS` impressions over a day (24 h to
:data:`bench.serving_lake.END`) with skew where real traffic has it (Zipf-like weights): 12
campaigns of 10 ads each, 60 sites, 8 countries, 4 device types, and an audience of 625,000 users
of whom a few are very active. About 1.7 % of impressions get a click, by the same user on the
same ad. Then, as one batch run covering the whole day leaves the lake (``batch/ctr`` minute rows
with their users' numbers, ``batch/ctr_hours``, ``batch/coverage``; ``speed/ctr`` empty), built
with DuckDB from the events; the events themselves go to a Delta table beside the lake, the scan
the benchmark compares with (what ``count(DISTINCT user_id)`` over ``master/events`` reads).

The minute rows' sketches are left null: the day is covered, so every answer counts its users
exactly and no sketch is read (their bytes are the batch benchmark's business).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Final

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from bench.serving_lake import END, reach_cube
from lake.settings import LakeSettings
from serving_layer.snapshots import SCHEMAS
from views import bitmaps
from views.columns import DIMENSIONS

EVENTS: Final = 5_000_000
USERS: Final = 625_000
CAMPAIGNS: Final = 12
ADS_PER_CAMPAIGN: Final = 10
SITES: Final = 60
COUNTRIES: Final = ("US", "IN", "GB", "DE", "BR", "FR", "JP", "CA")
DEVICES: Final = ("mobile", "desktop", "tablet", "ctv")
CTR: Final = 0.017
RUN_ID: Final = "run-day"


def _zipf(rng: np.random.Generator, n: int, size: int, s: float = 1.1) -> np.ndarray:
    """``size`` draws of 0 … n-1, value k weighted 1 / (k+1)^s (a few values most of the
    traffic, as sites, campaigns and users have it)."""
    weights = 1.0 / np.arange(1, n + 1) ** s
    return rng.choice(n, size=size, p=weights / weights.sum())


def realistic_events(events: int = EVENTS, *, seed: int = 69) -> pa.Table:
    """``events`` impressions and their clicks over the day (module docstring): event_time,
    the five dimensions, event_type, user_id and user_no (the user's number, as the batch
    layer's dictionary gives it: user ``u-N`` is number N + 1)."""
    rng = np.random.default_rng(seed)
    start_us = int((END - dt.timedelta(hours=24)).timestamp() * 1_000_000)
    # Traffic through the day: a sine over 24 h, busiest in the evening.
    hour = rng.choice(24, size=events, p=_daily_shape())
    times = start_us + hour * 3_600_000_000 + rng.integers(0, 3_600_000_000, events)
    campaign = _zipf(rng, CAMPAIGNS, events, 0.8)
    ad = campaign * ADS_PER_CAMPAIGN + _zipf(rng, ADS_PER_CAMPAIGN, events, 0.9)
    site = _zipf(rng, SITES, events, 1.0)
    country = rng.choice(len(COUNTRIES), size=events, p=_normed([40, 20, 9, 8, 8, 6, 5, 4]))
    device = rng.choice(len(DEVICES), size=events, p=_normed([62, 30, 6, 2]))
    user = _zipf(rng, USERS, events, 0.6)
    clicked = rng.random(events) < CTR
    # A click follows its impression within a minute, by the same user on the same ad.
    click_times = times[clicked] + rng.integers(1_000_000, 60_000_000, int(clicked.sum()))
    pick = np.concatenate([np.arange(events), np.flatnonzero(clicked)])
    kind = np.concatenate([np.zeros(events, np.int8), np.ones(int(clicked.sum()), np.int8)])
    when = np.concatenate([times, click_times])
    order = np.argsort(when, kind="stable")
    pick, kind, when = pick[order], kind[order], when[order]
    names = {
        "campaign_id": np.array([f"cmp-{c:03d}" for c in range(CAMPAIGNS)]),
        "ad_id": np.array(
            [
                f"ad-{a // ADS_PER_CAMPAIGN:03d}-{a % ADS_PER_CAMPAIGN:02d}"
                for a in range(CAMPAIGNS * ADS_PER_CAMPAIGN)
            ]
        ),
        "site_id": np.array([f"site-{s:04d}" for s in range(SITES)]),
        "country": np.array(COUNTRIES),
        "device_type": np.array(DEVICES),
    }
    codes = {"campaign_id": campaign, "ad_id": ad, "site_id": site, "country": country,
             "device_type": device}  # fmt: skip
    columns: dict[str, pa.Array] = {
        "event_time": pa.array(when, pa.timestamp("us", tz="UTC")),
        **{
            d: pa.DictionaryArray.from_arrays(pa.array(codes[d][pick]), pa.array(names[d])).cast(
                pa.string()
            )
            for d in DIMENSIONS
        },
        "event_type": pa.DictionaryArray.from_arrays(
            pa.array(kind), pa.array(["impression", "click"])
        ).cast(pa.string()),
        "user_no": pa.array(user[pick] + 1, pa.int32()),
    }
    columns["user_id"] = pc.binary_join_element_wise(
        "u-", pa.array(user[pick]).cast(pa.string()), ""
    )
    return pa.table(columns)


def _daily_shape() -> np.ndarray:
    hours = np.arange(24)
    return _normed(1.0 + 0.6 * np.sin((hours - 14) / 24 * 2 * np.pi))


def _normed(weights: object) -> np.ndarray:
    values: np.ndarray = np.asarray(weights, dtype=float)
    normed: np.ndarray = values / values.sum()
    return normed


def build_realistic_lake(
    lake: LakeSettings,
    events_path: Path,
    *,
    events: int = EVENTS,
    on_step: Callable[[str], None] = print,
) -> dict[str, int]:
    """The lake of the module docstring, and the events at ``events_path``. Returns the rows
    of each table written (and ``events``)."""
    table = realistic_events(events)
    on_step(f"{len(table):,} events drawn")
    write_deltalake(str(events_path), table.drop_columns(["user_no"]))
    con = duckdb.connect()
    con.register("events", table)
    dims = ", ".join(DIMENSIONS)
    minutes = con.execute(
        f"""
        SELECT time_bucket(INTERVAL 1 MINUTE, event_time) AS bucket_start, {dims},
               count(*) FILTER (WHERE event_type = 'impression') AS impressions,
               count(*) FILTER (WHERE event_type = 'click') AS clicks,
               '{RUN_ID}' AS run_id,
               list(DISTINCT user_no ORDER BY user_no) FILTER (WHERE event_type = 'impression')
                   AS user_nos,
               list(DISTINCT user_no ORDER BY user_no) FILTER (WHERE event_type = 'click')
                   AS clicker_nos
        FROM events GROUP BY ALL ORDER BY bucket_start
        """
    ).to_arrow_table()
    # DuckDB's list of no values is null: an empty list, as the batch job writes it.
    con.register("minutes", minutes)
    minutes = con.execute(
        "SELECT * REPLACE (coalesce(user_nos, []) AS user_nos, "
        "coalesce(clicker_nos, []) AS clicker_nos) FROM minutes"
    ).to_arrow_table()
    _write(lake, "batch/ctr", minutes)
    on_step(f"batch/ctr: {len(minutes):,} minute rows")
    con.register("minutes", minutes)
    gathered = con.execute(
        f"""
        SELECT time_bucket(INTERVAL 1 HOUR, bucket_start) AS bucket_start, {dims},
               sum(impressions)::BIGINT AS impressions, sum(clicks)::BIGINT AS clicks,
               '{RUN_ID}' AS run_id,
               flatten(list(user_nos)) AS user_bitmap, flatten(list(clicker_nos)) AS clicker_bitmap
        FROM minutes GROUP BY ALL
        """
    ).to_arrow_table()
    hours = pa.Table.from_batches(
        bitmaps.bitmap_batches(iter(gathered.to_batches()), ("user_bitmap", "clicker_bitmap"))
    )
    _write(lake, "batch/ctr_hours", hours)
    on_step(f"batch/ctr_hours: {len(hours):,} hour rows")
    cube = reach_cube(minutes, RUN_ID)
    _write(lake, "batch/ctr_reach", cube)
    on_step(f"batch/ctr_reach: {len(cube):,} reach cube rows")
    coverage = pa.Table.from_pylist(
        [
            {
                "run_id": RUN_ID,
                "view": "ctr",
                "interval_start": END - dt.timedelta(hours=24),
                "interval_end": END,
                "input_version": 1,
                "rows_written": len(minutes),
                "finished_at": END + dt.timedelta(minutes=75),
            }
        ],
        schema=SCHEMAS["batch/coverage"],
    )
    write_deltalake(lake.table("batch/coverage"), coverage, mode="append")
    _write(lake, "speed/ctr", pa.table({"bucket_start": pa.array([], pa.timestamp("us", "UTC"))}))
    return {
        "events": len(table),
        "batch/ctr": len(minutes),
        "batch/ctr_hours": len(hours),
        "batch/ctr_reach": len(cube),
    }


def _write(lake: LakeSettings, name: str, table: pa.Table) -> None:
    """``table`` appended to the lake's ``name``, its missing columns null, in its schema."""
    schema = SCHEMAS[name]
    columns = [
        table[f.name] if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in schema
    ]
    write_deltalake(
        lake.table(name), pa.Table.from_arrays(columns, schema=schema).cast(schema), mode="append"
    )
