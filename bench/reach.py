"""Reach benchmark (issues 51, 69): what ``reach=true`` costs per dashboard query, and where its
time goes, on two lakes.

The low-cardinality lake is the serving benchmark's (:mod:`bench.serving_lake`: 24 h x 300
dimension combinations, 17M impressions a day from an audience of 1M users; batch/ctr covered
for the first 22 h with lists of the users' numbers and sketches, and hour rows; speed/ctr with
sketches for the rest), and beside it an events table with the same impressions and clicks,
one row per event and the user it was drawn for: the reference, DuckDB's exact
``count(DISTINCT user_id)`` scanning it (delta_scan, as it would scan master/events). The
realistic lake (:mod:`bench.reach_lake`) is a day of 5 M impressions whose dimensions multiply
into a combination for nearly every few events, covered by one batch run, with its events
beside it; its queries are :data:`REALISTIC_QUERIES`.

Per query of :data:`bench.serving_in_process.REACH_QUERIES` (and of the realistic ones), in
process, one client, the better of 3 runs of each figure (one when it takes seconds):
- the answer without reach and with it (``ServingLayer.ctr``);
- the parts of reach: the CTR SQL (the answer without reach), the plan (which hours the reach
  cube and the hour rows stand in for), the unions of the cube's bitmaps (``cube``) and of the
  hour rows' (``bitmaps``), the exact distinct count over the batch rows' user lists where
  buckets are wholly covered otherwise (``counted``), the fetch of the other rows' sketches
  (``sketched``), the sketches' unions in Python, and the rest;
- what reach reads: the rows, the users listed, the sketches unioned and their bytes, and
  how many of them the answer used (exact buckets use the counts, the others the sketches);
- the reference scan.

Results to bench/results/reach.json.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import platform
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from bench.reach_lake import EVENTS, build_realistic_lake
from bench.serving_in_process import REACH_QUERIES
from bench.serving_lake import END, build_lake
from lake.catalog import batch_table
from lake.duckdb_delta import delta_duckdb
from lake.settings import LakeSettings
from serving_layer.query import CtrQuery
from serving_layer.reader import SnapshotReader
from serving_layer.service import ServingLayer
from views import sketches
from views.columns import DIMENSIONS

RESULTS: Final = Path("bench/results")
REPEATS: Final = 3
ONCE_ABOVE_S: Final = 2.0
EVENTS_SCHEMA: Final = pa.schema(
    [
        ("event_time", pa.timestamp("us", tz="UTC")),
        *((name, pa.string()) for name in DIMENSIONS),
        ("event_type", pa.string()),
        ("user_id", pa.string()),
    ]
)


# The realistic lake's queries (bench.reach_lake): the two of the issue, the dashboard's
# series and totals, and one grouped by two dimensions (no single dimension holds its answer).
REALISTIC_QUERIES: Final[dict[str, dict[str, str | int]]] = {
    "the day per hour and campaign": {
        "granularity": "hour",
        "hours": 24,
        "group_by": "campaign_id",
    },
    "the day by campaign": {"granularity": "all", "hours": 24, "group_by": "campaign_id"},
    "the day per hour": {"granularity": "hour", "hours": 24},
    "the day's total": {"granularity": "all", "hours": 24},
    "the day by site": {"granularity": "all", "hours": 24, "group_by": "site_id"},
    "the day by campaign and country": {
        "granularity": "all",
        "hours": 24,
        "group_by": "campaign_id,country",
    },
}


def main(events: int | None = None) -> dict[str, object]:
    """Both lakes: the serving benchmark's (low cardinality: 300 combinations) and the
    realistic one (:mod:`bench.reach_lake`, ``events`` impressions a day, 5 M by default)."""
    lakes = {"low cardinality": _low_cardinality(), "realistic": _realistic(events or EVENTS)}
    result = {"machine": {"cpus": _cpus(), "python": platform.python_version()}, "lakes": lakes}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reach.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, lake in lakes.items():
        _print(name, lake)
    return result


def _low_cardinality() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctr-bench-reach-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        events_path = Path(scratch) / "events"
        print("bench reach: writing the low-cardinality lake and its events ...", flush=True)
        started = time.perf_counter()
        rows = build_lake(lake, on_rows=lambda table: _write_events(events_path, table))
        print(f"bench reach: {rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
        return _measure_lake(lake, events_path, REACH_QUERIES, rows)


def _realistic(events: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctr-bench-reach-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        events_path = Path(scratch) / "events"
        print(f"bench reach: writing the realistic lake ({events:,} impressions) ...", flush=True)
        started = time.perf_counter()
        written = build_realistic_lake(
            lake, events_path, events=events, on_step=lambda step: print(f"bench reach: {step}")
        )
        print(f"bench reach: written in {time.perf_counter() - started:.0f} s", flush=True)
        return _measure_lake(lake, events_path, REALISTIC_QUERIES, written["batch/ctr"])


def _measure_lake(
    lake: LakeSettings, events_path: Path, shapes: Mapping[str, Mapping[str, Any]], rows: int
) -> dict[str, Any]:
    queries = {name: _query(shape) for name, shape in shapes.items()}
    serving = ServingLayer(SnapshotReader(lake, refresh_s=3600))
    try:
        figures = {}
        for name, query in queries.items():
            figures[name] = _measure(serving, query)
            print(f"bench reach: {name}: {figures[name]['with_ms']:.0f} ms with reach", flush=True)
    finally:
        serving.close()
    con = delta_duckdb()
    for name, query in queries.items():
        figures[name]["reference_scan_ms"] = _best(
            functools.partial(_scan, con, events_path, query)
        )
    event_rows = con.execute(f"SELECT count(*) FROM delta_scan('{events_path}')").fetchone()
    return {
        "lake_rows": rows,
        "event_rows": event_rows[0] if event_rows else 0,
        "queries": figures,
    }


def _query(shape: dict[str, Any] | Any) -> CtrQuery:
    return CtrQuery.create(
        start=END - dt.timedelta(hours=int(shape["hours"])),
        end=END,
        granularity=str(shape["granularity"]),
        group_by=str(shape["group_by"]).split(",") if "group_by" in shape else [],
    )


def _measure(serving: ServingLayer, query: CtrQuery) -> dict[str, Any]:
    """The figures of one query (module docstring), ms and counts."""
    reader = serving.reader
    snap = reader.snapshot()
    view = reader.definition(snap)
    figures: dict[str, Any] = {
        "without_ms": _best(lambda: serving.ctr(query, snap)),
        "with_ms": _best(lambda: serving.ctr(dataclasses.replace(query, reach=True), snap)),
    }
    within = reader.coverage(snap, view).within(query.start, query.end)
    exact = query.whole_buckets(within)  # the parts ServingLayer.ctr counts exactly
    # As ServingLayer.reach goes: the hours whose hour rows stand in for their minutes, the
    # buckets counted from their bitmaps, the rest counted from the minute rows' lists, and
    # the estimated buckets' sketches.
    # The plan: which hours the cube and the hour rows stand in for (their checks against the
    # minute rows' runs), and how many hour rows there would be to bring in.
    figures["plan_ms"] = _best(lambda: serving.planner.plan(query, snap, view, exact))
    plan = serving.planner.plan(query, snap, view, exact)
    figures["cube_ms"] = (
        _best(
            lambda: serving.planner.cube_counts(
                query, plan.cube, plan.dimension or "", plan.by_cube
            )
        )
        if plan.by_cube
        else 0.0
    )
    figures["bitmaps_ms"] = (
        _best(lambda: serving.planner.bitmap_counts(query, plan.hours, plan.by_bitmaps))
        if plan.by_bitmaps
        else 0.0
    )
    statements = plan.statements
    used = plan.used
    counted = statements.counted
    figures["counted_ms"] = _best(lambda: reader.fetch_all(*counted)) if counted else 0.0
    figures["sketched_ms"] = _best(lambda: reader.fetch_all(*statements.sketched))
    columns, found = reader.fetch_all(*statements.sketched)
    at = {name: i for i, name in enumerate(columns)}
    lists = [
        row[at[name]] or [] for row in found for name in ("reach_sketches", "clicker_sketches")
    ]
    figures["sketch_unions_ms"] = _best(lambda: [sketches.union(s) for s in lists])
    figures["rest_ms"] = max(
        figures["with_ms"]
        - figures["without_ms"]
        - figures["plan_ms"]
        - figures["cube_ms"]
        - figures["bitmaps_ms"]
        - figures["counted_ms"]
        - figures["sketched_ms"]
        - figures["sketch_unions_ms"],
        0.0,
    )
    figures["hours_used"] = sum(int((e - s) / dt.timedelta(hours=1)) for s, e in used)
    figures["cube_hours"] = sum(int((e - s) / dt.timedelta(hours=1)) for s, e in plan.by_cube)
    # What the answer used: the buckets wholly covered take the exact counts, the others the
    # sketches (serving_layer.reach.reach_of).
    answer = serving.ctr(dataclasses.replace(query, reach=True), snap)
    exact_keys = {
        (int(r.bucket_start.timestamp() * 1_000_000), *r.dimensions.values())
        for r in answer.rows
        if r.reach.exact
    }
    key_at = [at["bucket_us"], *(at[d] for d in query.group_by)]
    unioned = [s for row in found if tuple(row[i] for i in key_at) not in exact_keys for s in (
        row[at["reach_sketches"]] or [], row[at["clicker_sketches"]] or [])]  # fmt: skip
    figures["sketches_fetched"] = sum(len(s) for s in lists)
    figures["sketch_bytes_fetched"] = sum(len(b) for s in lists for b in s)
    figures["sketches_used"] = sum(len(s) for s in unioned)
    figures["rows"] = len(answer.rows)
    figures["exact_rows"] = sum(1 for r in answer.rows if r.reach.exact)
    figures.update(
        _read_counts(reader, reader.version_sides.reach(snap[batch_table(view)], None), query)
    )
    return figures


def _read_counts(reader: SnapshotReader, batch: str, query: CtrQuery) -> dict[str, int]:
    """The batch rows in ``query``'s range and the users their lists hold (numbers, or ids in
    rows written before the dictionary: what ``counted`` gathers)."""
    sql = f"""
        SELECT count(*),
               coalesce(sum(coalesce(len(user_nos), len(users))), 0)
               + coalesce(sum(coalesce(len(clicker_nos), len(clickers))), 0)
        FROM {batch} t WHERE t.bucket_start >= $start AND t.bucket_start < $end
    """
    _, [(rows, ids)] = reader.fetch_all(sql, {"start": query.start, "end": query.end})
    return {"batch_rows_in_range": int(rows), "user_ids_in_range": int(ids)}


def _scan(con: Any, path: Path, query: CtrQuery) -> None:
    """The reference: the exact reach of ``query``'s rows straight from the events."""
    if query.granularity == "all":
        bucket = "0"
    else:
        step = query.step // dt.timedelta(microseconds=1)
        bucket = f"epoch_us(event_time) // {step} * {step}"
    groups = "".join(f", {d}" for d in query.group_by)
    con.execute(
        f"""SELECT {bucket} AS bucket_us{groups}, count(DISTINCT user_id) AS reach
            FROM delta_scan('{path}')
            WHERE event_type = 'impression' AND event_time >= $start AND event_time < $end
            GROUP BY ALL""",
        {"start": query.start, "end": query.end},
    ).fetchall()


def _write_events(path: Path, table: pa.Table) -> None:
    """The events of ``table``'s rows (with user lists): per row, its impressions and clicks,
    each with a user of the row's list (every listed user at least once), spread over the
    row's minute."""
    parts = []
    kinds = (("impression", "impressions", "users"), ("click", "clicks", "clickers"))
    for kind, count, listed in kinds:
        n = table[count].to_numpy()
        users = pc.list_flatten(table[listed]).to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(table[listed]).fill_null(0).to_numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        row = np.repeat(np.arange(len(n)), n)
        k = np.arange(len(row)) - np.repeat(np.cumsum(n) - n, n)
        picked = users[offsets[row] + k % np.maximum(lengths[row], 1)]
        minute = table["bucket_start"].cast(pa.int64()).to_numpy()[row]
        columns = {
            "event_time": pa.array(minute + (k % 60) * 1_000_000, pa.int64()).cast(
                EVENTS_SCHEMA.field("event_time").type
            ),
            **{d: table[d].take(pa.array(row)) for d in DIMENSIONS},
            "event_type": pa.array(np.full(len(row), kind)),
            "user_id": pa.array(picked, pa.string()),
        }
        parts.append(pa.table(columns).cast(EVENTS_SCHEMA))
    write_deltalake(str(path), pa.concat_tables(parts), mode="append")


def _best(work: Callable[[], object]) -> float:
    """The better of REPEATS runs of ``work``, ms; one run when it takes over
    :data:`ONCE_ABOVE_S` (a figure of seconds varies less than the better of 3 would win)."""
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
        if times[-1] > ONCE_ABOVE_S:
            break
    return min(times) * 1000


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _print(name: str, result: dict[str, Any]) -> None:
    print(
        f"bench reach, the {name} lake: {result['lake_rows']:,} batch rows, "
        f"{result['event_rows']:,} events; in process, one client, the better of 3 (ms)"
    )
    header = (
        f"{'query':<48} {'without':>8} {'with':>8} {'plan':>6} {'cube':>6} {'bitmaps':>8} "
        f"{'counted':>8} "
        f"{'sketched':>8} {'unions':>8} {'rest':>7} {'scan':>7}  read"
    )
    print(header)
    for query, f in result["queries"].items():
        print(
            f"{query:<48} {f['without_ms']:>8.0f} {f['with_ms']:>8.0f} "
            f"{f['plan_ms']:>6.0f} {f['cube_ms']:>6.0f} {f['bitmaps_ms']:>8.0f} "
            f"{f['counted_ms']:>8.0f} "
            f"{f['sketched_ms']:>8.0f} {f['sketch_unions_ms']:>8.0f} {f['rest_ms']:>7.0f} "
            f"{f['reference_scan_ms']:>7.0f}  {f['batch_rows_in_range']:,} batch rows, "
            f"{f['user_ids_in_range']:,} ids; {f['sketches_fetched']:,} sketches "
            f"({f['sketch_bytes_fetched'] / 2**20:.0f} MiB), {f['sketches_used']:,} used; "
            f"{f['exact_rows']}/{f['rows']} rows exact; {f['cube_hours']} hour(s) from the cube, "
            f"{f['hours_used']} from hour rows"
        )
