"""The serving benchmark's lake, and the dashboard query asked of it.

A day (24 h to :data:`END`) of minute buckets x :data:`COMBOS` dimension combinations, written
with delta-rs: batch/ctr with coverage for the first :data:`COVERED_HOURS`, speed/ctr for the
rest; master/arrivals with the uncovered hours' arrivals and late arrivals in 1 % of the covered
minutes; and :class:`SpeedWriter`, which commits to speed/ctr every second during a run, as the
streaming job does.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from batch_layer.reach_cube import KEYS, partial_cube_batches, union_cube_batches
from lake.settings import LakeSettings
from serving_layer.snapshots import SCHEMAS
from views import bitmaps
from views.columns import DIMENSIONS, USER_BITMAPS, USER_LISTS, USER_NUMBERS

END = dt.datetime(2026, 11, 22, 0, 0, tzinfo=dt.UTC)
HOURS = 24
COVERED_HOURS = 22
COMBOS = 300
# An advertiser's campaigns (of the 20 in the lake) for the runs with its key.
ADVERTISER_CAMPAIGNS: Final = ("cmp-003", "cmp-007", "cmp-011")


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
    and per click drawn from :data:`USERS` (so rows share users), as sketches, and when
    ``lists`` (batch rows) as sorted lists of the users' numbers (``user-N`` is number N + 1,
    as a dictionary would number them) and of their ids (what :func:`build_lake`'s
    ``on_rows`` is given; the batch layer stores numbers only)."""
    from views import sketches
    from views.columns import SKETCHES, USER_LISTS, USER_NUMBERS

    rng = np.random.default_rng(seed)
    for counts, list_name, sketch_name, numbers_name in zip(
        ("impressions", "clicks"), USER_LISTS, SKETCHES, USER_NUMBERS, strict=True
    ):
        n = table[counts].to_numpy()
        offsets = np.concatenate([[0], np.cumsum(n)])
        drawn = rng.integers(0, USERS, int(offsets[-1]))
        numbers = [np.unique(drawn[offsets[i] : offsets[i + 1]]) for i in range(len(n))]
        per_row = [np.char.add("user-", u.astype(str)).tolist() for u in numbers]
        table = table.append_column(
            sketch_name, pa.array([sketches.sketch(u) for u in per_row], pa.binary())
        )
        if lists:
            table = table.append_column(list_name, pa.array(per_row, pa.list_(pa.string())))
            table = table.append_column(
                numbers_name, pa.array([(u + 1).tolist() for u in numbers], pa.list_(pa.int32()))
            )
    return table


def build_lake(
    lake: LakeSettings,
    *,
    end: dt.datetime = END,
    on_rows: Callable[[pa.Table], None] | None = None,
    combinations: int = COMBOS,
) -> int:
    """batch/ctr hour by hour with coverage for the first COVERED_HOURS, speed/ctr for the
    last hour covered (not pruned yet) and the uncovered rest, in 1-minute commits' worth of
    files. ``on_rows`` is given each part's rows before they are written, every one with its
    user lists (bench.reach writes their events); ``combinations`` per minute (fewer: a smoke
    run's lake). Returns the rows written."""
    dims = combos(combinations)
    start = end - dt.timedelta(hours=HOURS)
    rows = 0
    for hour in range(COVERED_HOURS):
        at = start + dt.timedelta(hours=hour)
        run_id = f"run-{hour:02d}"
        table = with_reach(minute_rows(at, 60, dims, seed=hour), seed=hour, lists=True)
        if on_rows is not None:
            on_rows(table)
        table = table.append_column("run_id", pa.array([run_id] * len(table)))
        batch_schema = SCHEMAS["batch/ctr"]
        stored = table
        for name in USER_LISTS:  # ids: only rows written before the dictionary have them
            index = stored.schema.get_field_index(name)
            stored = stored.set_column(index, name, pa.nulls(len(stored), pa.list_(pa.string())))
        write_deltalake(
            lake.table("batch/ctr"),
            stored.select(batch_schema.names).cast(batch_schema),
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
        hours = hour_rows(table, len(dims["campaign_id"]))
        hours_schema = SCHEMAS["batch/ctr_hours"]
        write_deltalake(
            lake.table("batch/ctr_hours"),
            hours.select(hours_schema.names).cast(hours_schema),
            mode="append",
        )
        cube_schema = SCHEMAS["batch/ctr_reach"]
        write_deltalake(
            lake.table("batch/ctr_reach"),
            reach_cube(table, run_id).select(cube_schema.names).cast(cube_schema),
            mode="append",
        )
        rows += len(table)
    speed_start = start + dt.timedelta(hours=COVERED_HOURS - 1)
    for chunk in range(0, (HOURS - COVERED_HOURS + 1) * 60, 10):
        table = minute_rows(speed_start + dt.timedelta(minutes=chunk), 10, dims, seed=1000 + chunk)
        table = with_reach(table, seed=1000 + chunk, lists=on_rows is not None)
        if on_rows is not None and chunk >= 60:  # the covered hour's events are the batch's
            on_rows(table)
        table = table.append_column(
            "updated_at", pa.array([end] * len(table), pa.timestamp("us", tz="UTC"))
        )
        write_deltalake(lake.table("speed/ctr"), speed_rows(table), mode="append")
        rows += len(table)
    return rows


def hour_rows(table: pa.Table, combinations: int) -> pa.Table:
    """The batch layer's hour rows (batch_layer.hours) of ``table``, an hour's minute rows
    (minute by minute, every combination in the same order): per combination, the counts
    summed, bitmaps of the users' numbers and the minutes' sketches unioned."""
    from views import sketches
    from views.columns import SKETCHES, USER_NUMBERS

    combo = np.arange(len(table)) % combinations
    first = table.slice(0, combinations)
    columns: dict[str, object] = {
        "bucket_start": first["bucket_start"],
        **{d: first[d] for d in DIMENSIONS},
        "run_id": first["run_id"],
    }
    for name in ("impressions", "clicks"):
        columns[name] = pa.array(np.bincount(combo, table[name].to_numpy(), combinations))
        columns[name] = columns[name].cast(pa.int64())  # type: ignore[attr-defined]
    for listed, bitmap_name, sketch_name in zip(USER_NUMBERS, USER_BITMAPS, SKETCHES, strict=True):
        numbers: list[list[int]] = [[] for _ in range(combinations)]
        parts: list[list[bytes]] = [[] for _ in range(combinations)]
        for i, (users, sketch) in enumerate(
            zip(table[listed].to_pylist(), table[sketch_name].to_pylist(), strict=True)
        ):
            numbers[i % combinations].extend(users or ())
            parts[i % combinations].append(sketch)
        columns[bitmap_name] = pa.array([bitmaps.bitmap(n) for n in numbers], pa.binary())
        columns[sketch_name] = pa.array([sketches.union_sketch(p) for p in parts], pa.binary())
    return pa.table(columns)


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


def dashboard_params(end: dt.datetime = END) -> dict[str, str]:
    start = end - dt.timedelta(hours=24)
    return {
        "start": start.isoformat().replace("+00:00", "Z"),
        "end": end.isoformat().replace("+00:00", "Z"),
        "granularity": "hour",
        "group_by": "campaign_id",
    }


def dashboard_path() -> str:
    """The dashboard query as a request path."""
    from urllib.parse import urlencode

    return f"/api/v1/ctr?{urlencode(dashboard_params())}"


class SpeedWriter(threading.Thread):
    """Commits a small speed/ctr batch every second (beyond the queried range), as the stream
    does, so the API keeps seeing new snapshot versions."""

    def __init__(self, lake: LakeSettings, *, compact_every: int | None = None) -> None:
        """``compact_every``: compact speed/ctr after that many commits, as the speed job
        compacts its minutes once a minute (a long run's reads then stay the same size)."""
        super().__init__(daemon=True)
        self.lake = lake
        self.stop = threading.Event()
        self.commits = 0
        self.compact_every = compact_every

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
            if self.compact_every and self.commits % self.compact_every == 0:
                DeltaTable(self.lake.table("speed/ctr")).optimize.compact()


def reach_cube(minutes: pa.Table, run_id: str) -> pa.Table:
    """The reach cube (:mod:`batch_layer.reach_cube`) of ``minutes``, whole hours' minute rows
    with their users' numbers, by the job's own Arrow tasks: the rows cubed in parts (as the
    job's tasks cube theirs), the parts unioned by key."""
    hours = minutes.select(["bucket_start", *DIMENSIONS, *USER_NUMBERS])
    hours = hours.set_column(
        0, "bucket_start", pc.floor_temporal(hours.column("bucket_start"), unit="hour")
    )
    partial = pa.Table.from_batches(
        list(partial_cube_batches(iter(hours.to_batches(max_chunksize=100_000))))
    )
    ordered = partial.sort_by([(k, "ascending") for k in KEYS])  # as the job's exchange sorts
    unioned = pa.Table.from_batches(list(union_cube_batches(iter(ordered.to_batches()))))
    return unioned.append_column("run_id", pa.array([run_id] * len(unioned), pa.string()))
