"""Batch benchmark: the batch job over one day of 10M events against DuckDB doing the same.

The events (2 % of them resent duplicates) are generated straight into a Delta master/events
table (one event_date partition). In one run, twice in turn: the batch job for the whole day on
a warm local[2] SparkSession (warmed by a one-minute run), then DuckDB (delta extension)
computing the same view with the same dedup rule over the same table; both results are checked
to agree. The ratio is of each side's better run (the first runs' ratio is printed too).
Then the cost of click attribution: version 3 of the view (each click credited to its
impression, :func:`views.ctr.attributed_ctr`) over the same day, twice, next to version 1's
figure from the same process. A click names an impression shown seconds to minutes before
it, as in live traffic.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from batch_layer.interval import Interval
from batch_layer.job import BatchRun, run
from bench import batch_local
from events.records import EVENTS_SCHEMA
from ingest.traffic import COUNTRY_MIX, DEVICE_MIX
from lake.catalog import MASTER_EVENTS
from lake.duckdb_delta import delta_duckdb
from lake.settings import LakeSettings
from runtime.spark import spark_session
from runtime.spark_settings import SparkSettings
from views.definitions import Definition, definition

V1, V3 = definition("ctr", 1), definition("ctr", 3)

DEFAULT_EVENTS = 10_000_000
DAY = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
RESULTS = Path("bench/results")

DUCKDB_VIEW = """
WITH events AS (
    SELECT * FROM delta_scan('{path}')
    WHERE event_date = DATE '{day}'
      AND event_time >= TIMESTAMPTZ '{start}' AND event_time < TIMESTAMPTZ '{end}'
), first AS (
    SELECT * FROM events
    QUALIFY row_number() OVER (
        PARTITION BY event_id ORDER BY ingest_time, kafka_partition, kafka_offset) = 1
)
SELECT time_bucket(INTERVAL 1 minute, event_time) AS bucket_start,
       campaign_id, ad_id, site_id, country, device_type,
       count(*) FILTER (WHERE event_type = 'impression') AS impressions,
       count(*) FILTER (WHERE event_type = 'click') AS clicks
FROM first GROUP BY ALL
"""


def main(events: int | None = None) -> dict[str, object]:
    events = events or DEFAULT_EVENTS
    with tempfile.TemporaryDirectory(prefix="ctr-bench-batch-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        print(f"bench batch: generating {events:,} events into master/events ...", flush=True)
        started = time.perf_counter()
        _generate(MASTER_EVENTS.path(lake), events)
        print(f"bench batch: generated in {time.perf_counter() - started:.0f} s", flush=True)
        return _measure(lake, events)


def _generate(path: str, events: int, chunk: int = 2_000_000, day: dt.datetime = DAY) -> None:
    rng = np.random.default_rng(42)
    ads = np.array([f"ad-{c:03d}-{a:02d}" for c in range(1, 21) for a in range(1, 9)])
    campaigns = np.array([a[:7].replace("ad-", "cmp-") for a in ads])
    sites = np.array([f"site-{s:04d}" for s in range(1, 301)])
    ad_p = 1 / np.arange(1, len(ads) + 1) ** 1.1
    site_p = 1 / np.arange(1, len(sites) + 1) ** 1.1
    countries, country_p = np.array(list(COUNTRY_MIX)), np.array(list(COUNTRY_MIX.values()), float)
    devices, device_p = np.array(list(DEVICE_MIX)), np.array(list(DEVICE_MIX.values()), float)
    day_us = int(day.timestamp() * 1_000_000)
    unique = int(events / 1.02)
    offset = 0
    for start in range(0, events, chunk):
        n = min(chunk, events - start)
        positions = np.arange(start, start + n)
        # The last 2 % of the rows resend earlier events: an event's content follows from its
        # id, so a duplicate is an exact copy (only its Kafka offset differs).
        ids = np.where(positions < unique, positions, rng.integers(0, unique, n))
        seed = ids.astype(np.uint64) * np.uint64(2654435761) % np.uint64(2**32)
        when = day_us + (seed * np.uint64(20_116)) % np.uint64(86_400_000_000)
        click = seed % np.uint64(50) == 0
        # A click names the event 7 ids before it (an impression 49 times in 50) and happens
        # 1-255 s after it.
        shown = np.maximum(ids - 7, 0)
        shown_seed = shown.astype(np.uint64) * np.uint64(2654435761) % np.uint64(2**32)
        shown_when = day_us + (shown_seed * np.uint64(20_116)) % np.uint64(86_400_000_000)
        delay = (seed % np.uint64(255) + np.uint64(1)) * np.uint64(1_000_000)
        when = np.where(
            click, np.minimum(shown_when + delay, np.uint64(day_us + 86_399_999_999)), when
        )
        pick = seed % np.uint64(1_000_003)
        ad = _choose(pick, ad_p)
        table = pa.table(
            {
                "event_id": _ids("evt", ids),
                "event_type": pa.array(np.where(click, "click", "impression")),
                "event_time": pa.array(when.astype(np.int64), pa.timestamp("us", tz="UTC")),
                "impression_id": _ids("imp", np.where(click, shown, ids)),
                "ad_id": pa.array(ads[ad]),
                "campaign_id": pa.array(campaigns[ad]),
                "site_id": pa.array(sites[_choose(_key(seed, 7), site_p)]),
                "country": pa.array(countries[_choose(_key(seed, 11), country_p)]),
                "device_type": pa.array(devices[_choose(_key(seed, 13), device_p)]),
                "user_id": _users(seed % np.uint64(200_000)),
                "schema_version": pa.array(np.ones(n, np.int32)),
                "event_date": pa.array(np.full(n, day.date())),
                # The Kafka key is the impression id: a click shares its impression's partition.
                "kafka_partition": pa.array((np.where(click, shown, ids) % 6).astype(np.int32)),
                "kafka_offset": pa.array(np.arange(offset, offset + n, dtype=np.int64)),
                "ingest_time": pa.array(when.astype(np.int64) + 1000, pa.timestamp("us", tz="UTC")),
            }
        ).cast(EVENTS_SCHEMA)
        offset += n
        write_deltalake(path, table, mode="append", partition_by=["event_date"])


def _spark_run(
    spark: SparkSession,
    lake: LakeSettings,
    interval: Interval,
    attempt: int,
    version: Definition = V1,
    *,
    reach: bool = True,
) -> tuple[float, BatchRun, dict[str, float]]:
    """The batch job over ``interval``: (seconds, its run, seconds per step)."""
    print(
        f"bench batch: batch job (Spark) over the day, version {version.version}"
        f"{'' if reach else ', without reach'} (run {attempt}) ...",
        flush=True,
    )
    started = time.perf_counter()
    steps: list[tuple[float, str]] = []
    # A run id of its own: a rerun of a committed run commits nothing (lake/view_files.py).
    run_id = f"bench-v{version.version}-{'reach' if reach else 'plain'}-{attempt}"
    result = run(
        spark, interval, lake=lake, definition=version, reach=reach, run_id=run_id,
        on_step=lambda step: steps.append((time.perf_counter(), step)),
    )  # fmt: skip
    seconds = time.perf_counter() - started
    # Where the time went: each step lasts until the next one starts.
    ends = [t for t, _ in steps[1:]] + [started + seconds]
    profile = {step: round(end - t, 1) for (t, step), end in zip(steps, ends, strict=True)}
    for step, step_seconds in profile.items():
        print(f"  {step_seconds:6.1f} s  {step}")
    return seconds, result, profile


def _view_parts(spark: SparkSession, lake: LakeSettings, interval: Interval) -> dict[str, float]:
    """Seconds of the view's parts, cumulatively, over the day's events: the scan of the
    columns the job reads, + the view's aggregation without the dedup, + the dedup's exchange
    of every row by event_id, + its sort (the job's view, in the job's partitions). Each is
    run to completion into Spark's ``noop`` sink, so no write is timed."""
    from batch_layer.job import deduplicate, interval_events
    from views.columns import DIMENSIONS
    from views.ctr import ctr

    read = [
        "event_id", "event_type", "event_time", *DIMENSIONS,
        "ingest_time", "kafka_partition", "kafka_offset",
    ]  # fmt: skip
    all_columns, partitions, _ = interval_events(
        spark, MASTER_EVENTS.path(lake), DeltaTable(MASTER_EVENTS.path(lake)), interval
    )
    events = all_columns.select(*read)
    parts = {
        "scan (the columns the job reads)": events,
        "scan + view, no dedup": events.transform(ctr),
        # The dedup's two halves: its exchange of every row by event_id, then its sort.
        f"scan + exchange by event_id + view, no dedup ({partitions} partitions)": (
            events.repartition(partitions, "event_id").transform(ctr)
        ),
        f"scan + dedup + view (the job's, {partitions} partitions)": deduplicate(
            events, partitions
        ).transform(ctr),
    }
    seconds = {}
    for name, frame in parts.items():
        started = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        seconds[name] = round(time.perf_counter() - started, 1)
    return seconds


def _stored_bytes(path: str) -> dict[str, int]:
    """Compressed bytes of the table's current files (its Parquet footers): in all, in the
    user lists, in the sketches and in the other columns."""
    import pyarrow.parquet as pq

    from views.columns import SKETCHES, USER_BITMAPS, USER_LISTS, USER_NUMBERS

    sizes = {"total": 0, "users": 0, "sketches": 0, "rest": 0}
    if not DeltaTable.is_deltatable(path):
        return sizes
    table = DeltaTable(path)
    for file in table.file_uris():
        metadata = pq.ParquetFile(file).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            for column in range(row_group.num_columns):
                chunk = row_group.column(column)
                name = chunk.path_in_schema.split(".")[0]
                listed = name in (*USER_LISTS, *USER_NUMBERS, *USER_BITMAPS)
                kind = "users" if listed else "sketches" if name in SKETCHES else "rest"
                sizes[kind] += chunk.total_compressed_size
                sizes["total"] += chunk.total_compressed_size
    return sizes


def _ids(prefix: str, numbers: np.ndarray) -> pa.Array:
    """Ids as the traffic generator makes them (``evt-`` and 24 random-looking hex digits,
    :mod:`ingest.traffic`), one per number: a sort by them compares their whole 28 bytes, as
    it does in live traffic, not a short decimal."""
    mixed = numbers.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    low = (numbers.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)) >> np.uint64(32)
    pairs = zip(mixed.tolist(), low.tolist(), strict=True)
    return pa.array([f"{prefix}-{m:016x}{w:08x}" for m, w in pairs])


def _users(numbers: np.ndarray) -> pa.Array:
    """User ids as the traffic generator makes them (``user-0001234``)."""
    return pa.array([f"user-{u:07d}" for u in numbers.tolist()])


def _key(seed: np.ndarray, salt: int) -> np.ndarray:
    return seed // np.uint64(salt) % np.uint64(1_000_003)


def _choose(uniform_key: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Index drawn with ``weights`` from a deterministic key in [0, 1_000_003)."""
    cumulative = np.cumsum(weights / weights.sum())
    return np.minimum(np.searchsorted(cumulative, uniform_key / 1_000_003), len(weights) - 1)


def _measure(lake: LakeSettings, events: int) -> dict[str, object]:
    interval = Interval(DAY, DAY + dt.timedelta(days=1))
    spark_settings = SparkSettings()
    spark = spark_session(spark_settings, lake.object_store)
    # Warm the session as a long-running one is: one small run (a minute) loads Delta's and
    # Parquet's code paths; its rows are replaced by the measured run.
    run(spark, Interval(DAY, DAY + dt.timedelta(minutes=1)), lake=lake, run_id="warm-up")
    con = delta_duckdb()
    sql = DUCKDB_VIEW.format(path=MASTER_EVENTS.path(lake), day=DAY.date(), start=DAY.isoformat(),
                             end=interval.end.isoformat())  # fmt: skip
    # Each side twice, in turn; the better run of each is its figure (this machine's times
    # move by a third between minutes). The second Spark run replaces the day with the same
    # rows (same input version, another run id).
    runs: list[tuple[float, BatchRun, dict[str, float]]] = []
    ducks: list[float] = []
    for attempt in (1, 2):
        runs.append(_spark_run(spark, lake, interval, attempt))
        print(f"bench batch: DuckDB over the same table (run {attempt}) ...", flush=True)
        started = time.perf_counter()
        query = f"SELECT count(*), sum(impressions), sum(clicks) FROM ({sql})"
        duck = con.execute(query).fetchone()
        ducks.append(time.perf_counter() - started)
        print(f"  {ducks[-1]:6.1f} s  DuckDB")
    spark_seconds, result, profile = min(runs, key=lambda r: r[0])
    duck_seconds = min(ducks)

    view = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table(columns=["impressions", "clicks"])
    ours = (
        view.num_rows,
        sum(view.column("impressions").to_pylist()),
        sum(view.column("clicks").to_pylist()),
    )
    if duck is None or tuple(duck) != ours:
        raise RuntimeError(f"the two disagree: Spark {ours}, DuckDB {duck}")
    ratio = spark_seconds / duck_seconds
    first_ratio = runs[0][0] / ducks[0]
    parts = _view_parts(spark, lake, interval)
    # The dedup without an exchange, a candidate the job does not use (bench/batch_local.py).
    parts |= batch_local.parts(
        spark,
        DeltaTable(MASTER_EVENTS.path(lake)).file_uris(),
        interval,
        Path(lake.lake_root).parent / "local-dedup",
        ours,
    )
    parts |= batch_local.reach_parts(spark, lake, interval)
    # Reach: what the user lists and sketches cost in time (version 1 without them, twice, in
    # the same process) and in storage (the day's files, per column, with and without).
    stored = _stored_bytes(lake.table("batch/ctr"))
    stored_hours = _stored_bytes(lake.table("batch/ctr_hours"))
    stored_cube = _stored_bytes(lake.table("batch/ctr_reach"))
    stored_dictionary = _stored_bytes(lake.table("batch/users"))
    unreached = [_spark_run(spark, lake, interval, attempt, reach=False) for attempt in (1, 2)]
    plain_seconds = min(r[0] for r in unreached)
    stored_plain = _stored_bytes(lake.table("batch/ctr"))
    # Click attribution: version 3 over the same day, twice; its better run next to version 1's.
    attributed = [_spark_run(spark, lake, interval, attempt, V3) for attempt in (1, 2)]
    v3_seconds = min(r[0] for r in attributed)
    v3 = DeltaTable(lake.table("batch/ctr_v3")).to_pyarrow_table()
    v3_totals = {
        name: int(pc.sum(v3.column(name)).as_py() or 0)
        for name in ("impressions", "clicks", "raw_clicks", "orphan_clicks", "repeat_clicks")
    }
    if v3_totals["impressions"] != ours[1] or v3_totals["raw_clicks"] != ours[2]:
        raise RuntimeError(f"version 3 disagrees with version 1: {v3_totals} vs {ours}")
    outcome = {
        "benchmark": "batch",
        "events": events,
        "view_rows": result.rows_written,
        "spark_seconds": round(spark_seconds, 2),
        "duckdb_seconds": round(duck_seconds, 2),
        "spark_runs_seconds": [round(r[0], 2) for r in runs],
        "duckdb_runs_seconds": [round(d, 2) for d in ducks],
        "ratio": round(ratio, 2),
        "first_runs_ratio": round(first_ratio, 2),
        "goal": "<= 2.5",
        "spark_profile_seconds": profile,
        "attributed_seconds": round(v3_seconds, 2),
        "attributed_runs_seconds": [round(r[0], 2) for r in attributed],
        "attributed_over_plain": round(v3_seconds / spark_seconds, 2),
        "attributed_totals": v3_totals,
        "view_parts_seconds": parts,
        "without_reach_seconds": round(plain_seconds, 2),
        "without_reach_runs_seconds": [round(r[0], 2) for r in unreached],
        "reach_over_plain": round(spark_seconds / plain_seconds, 2),
        "without_reach_ratio": round(plain_seconds / duck_seconds, 2),
        "stored_bytes": stored,
        "stored_bytes_without_reach": stored_plain,
        "stored_bytes_hours": stored_hours,
        "stored_bytes_reach_cube": stored_cube,
        "stored_bytes_dictionary": stored_dictionary,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {spark_settings.master}",
    }
    print(
        f"bench batch: {events:,} events -> {result.rows_written:,} rows; Spark batch job "
        f"{spark_seconds:.1f} s, DuckDB {duck_seconds:.1f} s (the better of two runs each: "
        f"{', '.join(f'{r[0]:.1f}' for r in runs)} s and "
        f"{', '.join(f'{d:.1f}' for d in ducks)} s), ratio {ratio:.2f} (goal <= 2.5; "
        f"first runs {first_ratio:.2f})"
    )
    print(
        f"bench batch: click attribution (version 3) {v3_seconds:.1f} s (the better of "
        f"{', '.join(f'{r[0]:.1f}' for r in attributed)} s) against version 1's "
        f"{spark_seconds:.1f} s: x{v3_seconds / spark_seconds:.2f}; "
        + ", ".join(f"{k} {v:,}" for k, v in v3_totals.items())
    )
    print(
        "bench batch: reach (users numbered, their lists, sketches, hour rows) costs "
        f"x{spark_seconds / plain_seconds:.2f}: {spark_seconds:.1f} s with, "
        f"{plain_seconds:.1f} s without (the better of "
        f"{', '.join(f'{r[0]:.1f}' for r in unreached)} s); without it the ratio to DuckDB is "
        f"{plain_seconds / duck_seconds:.2f}"
    )
    mib = 2**20
    print(
        f"bench batch: batch/ctr for the day: {stored['total'] / mib:.1f} MiB with reach "
        f"(user lists {stored['users'] / mib:.1f} MiB, sketches {stored['sketches'] / mib:.1f} MiB,"
        f" the rest {stored['rest'] / mib:.1f} MiB), {stored_plain['total'] / mib:.1f} MiB without"
    )
    print(
        f"bench batch: batch/ctr_hours for the day: {stored_hours['total'] / mib:.1f} MiB "
        f"(bitmaps {stored_hours['users'] / mib:.1f} MiB, sketches "
        f"{stored_hours['sketches'] / mib:.1f} MiB); the reach cube (batch/ctr_reach) "
        f"{stored_cube['total'] / mib:.1f} MiB; the user dictionary (batch/users) "
        f"{stored_dictionary['total'] / mib:.1f} MiB"
    )
    print("bench batch: the view's parts, each run alone to completion (nothing written):")
    for part, seconds in parts.items():
        print(f"  {seconds:6.1f} s  {part}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "batch.json").write_text(json.dumps(outcome, indent=2) + "\n")
    return outcome
