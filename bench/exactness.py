"""What the analyst sees, checked on a running deployment (``make demo``): how much of what is
old enough to be exact is shown exact, whether each row's late-event count is its own, what the
stale banner and the drift headline say.

    source run/demo/env   # API_TOKEN, API_PORT, LAKE_ROOT of the running demo
    python -m bench.exactness [--hours 3] [--burst]

Printed, over the last ``--hours``:
- **minutes**: the minute buckets older than the published version's settle delay, by source
  (``batch`` is exact; ``stale`` holds late events no run counted yet), and the same per
  campaign and country;
- **late counts**: per campaign over the range, the row's ``stale_events`` against the late
  events of that campaign in the master dataset (``master/arrivals`` rows a covering run has not
  read, within the attribution window of a covered minute of the range): a row may not count
  more than its own;
- **banner**: the stale intervals ``/api/v1/views`` lists (what the dashboard's banner shows);
- **drift**: the headline the drift panel shows (median and 99th percentile), and the volume
  weighted error over the same minutes;
- with ``--burst``: 2,000 events from 20 minutes before the settle delay (or
  ``--burst-minutes-ago``) sent now, as Getting started's late events step does, then the time
  until the API no longer counts them as late in their minutes (a recompute counted them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import pyarrow.compute as pc

from lake.catalog import MASTER_ARRIVALS
from lake.coverage.log import read_runs
from lake.settings import LakeSettings
from lake.storage import is_delta, open_delta
from views.definitions import definition

MINUTE = dt.timedelta(minutes=1)
LATENESS = dt.timedelta(minutes=10)  # the speed layer's default watermark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=3.0, help="range checked (default 3)")
    parser.add_argument("--burst", action="store_true", help="send a late burst and time it")
    parser.add_argument("--burst-timeout", type=float, default=900.0, help="seconds to wait")
    parser.add_argument(
        "--burst-minutes-ago",
        type=int,
        default=None,
        help="event time of the burst (default: 20 min before the settle delay)",
    )
    args = parser.parse_args(argv)
    api = f"http://127.0.0.1:{os.environ.get('API_PORT', '8000')}"
    client = httpx.Client(
        base_url=api, headers={"Authorization": f"Bearer {os.environ['API_TOKEN']}"}, timeout=60
    )
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    start = now - dt.timedelta(hours=args.hours)
    views = client.get("/api/v1/views").raise_for_status().json()["views"][0]
    view = definition("ctr", views["version"])
    settle = (view.attribution or dt.timedelta(0)) + LATENESS
    print(f"now {now:%H:%M} UTC · ctr version {view.version} · settle delay {settle}")
    settled = now - settle
    _minutes(client, start, now, settled)
    _late_counts(client, start, now, view.attribution or dt.timedelta(0), view.key)
    _banner(views)
    _drift(views)
    if args.burst:
        ago = args.burst_minutes_ago
        begin = settled - dt.timedelta(minutes=20) if ago is None else now - ago * MINUTE
        _burst(client, begin, args.burst_timeout)
    return 0


def _ctr(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/api/v1/ctr", params={"limit": 100000, **params}).raise_for_status()
    return list(answer.json()["rows"])


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _minutes(
    client: httpx.Client, start: dt.datetime, end: dt.datetime, settled: dt.datetime
) -> None:
    for group in ((), ("campaign_id", "country")):
        rows = _ctr(
            client, start=_iso(start), end=_iso(settled), granularity="minute", group_by=group
        )
        sources = Counter(r["source"] for r in rows)
        weights: Counter[str] = Counter()
        for r in rows:
            weights[r["source"]] += r["impressions"]
        total = sum(sources.values())
        stale_rows = [r for r in rows if r["source"] == "stale"]
        label = "minutes" if not group else "rows per minute, campaign and country"
        shares = ", ".join(
            f"{source} {n} ({100 * n / total:.1f} %)" for source, n in sources.most_common()
        )
        print(f"{label} older than the settle delay ({_iso(start)} to {_iso(settled)}): {total}")
        print(f"  {shares or 'none'}")
        weighed = sum(weights.values())
        if weighed:
            print(
                "  by impressions: "
                + ", ".join(
                    f"{source} {100 * n / weighed:.1f} %" for source, n in weights.most_common()
                )
            )
        if stale_rows:
            late = sum(r["stale_events"] for r in stale_rows)
            impressions = sum(r["impressions"] for r in stale_rows)
            print(
                f"  stale rows: {len(stale_rows)}, {late:,} late events over {impressions:,} "
                "impressions"
            )
    recent = _ctr(client, start=_iso(settled), end=_iso(end), granularity="minute")
    print(f"minutes within the settle delay: {Counter(r['source'] for r in recent)}")


def _late_counts(
    client: httpx.Client,
    start: dt.datetime,
    end: dt.datetime,
    window: dt.timedelta,
    key: str,
) -> None:
    """Per campaign: stale_events of its row over [start, end) against the late events of its
    own campaign (arrivals a covering run has not read, that may change a covered minute of the
    range)."""
    # The API first, the lake after: what the lake holds by then includes every arrival the
    # API's snapshot could count (the archiver keeps appending), so the bound holds.
    rows = _ctr(client, start=_iso(start), end=_iso(end), granularity="all", group_by="campaign_id")
    lake = LakeSettings()
    runs = read_runs(lake)
    lo, hi = start - window, end + window
    versions = runs.input_versions(key, lo, hi)
    path = MASTER_ARRIVALS.path(lake)
    late: dict[str, int] = defaultdict(int)
    if is_delta(path, lake.object_store):
        arrivals = open_delta(path, lake.object_store).to_pyarrow_table(
            columns=["bucket_start", "campaign_id", "impressions", "clicks", "events_version"]
        )
        in_range = pc.and_(
            pc.greater_equal(arrivals["bucket_start"], lo), pc.less(arrivals["bucket_start"], hi)
        )
        reach = window // MINUTE
        first = (start - lo) // MINUTE
        last = (end - lo) // MINUTE  # minutes of the range: [first, last)
        for row in arrivals.filter(in_range).to_pylist():
            at = (row["bucket_start"] - lo) // MINUTE
            span = []
            if row["clicks"]:
                span.append((max(at - reach, first), min(at + 1, last)))
            if row["impressions"]:
                span.append((max(at, first), min(at + reach + 1, last)))
            older = [
                versions[i]
                for a, b in span
                for i in range(a, b)
                if versions[i] is not None and versions[i] < row["events_version"]
            ]
            if older:
                late[row["campaign_id"]] += row["impressions"] + row["clicks"]
    over = [r for r in rows if r["stale_events"] > late.get(r["campaign_id"], 0)]
    larger = [r for r in rows if r["stale_events"] > r["impressions"]]
    print(
        f"late counts per campaign over the range: {len(rows)} rows; stale_events above the "
        f"campaign's own late events: {len(over)}; above the row's impressions: {len(larger)}"
    )
    for r in sorted(rows, key=lambda r: -r["stale_events"])[:5]:
        print(
            f"  {r['campaign_id']}: impressions {r['impressions']:,}, stale_events "
            f"{r['stale_events']:,}, own late events {late.get(r['campaign_id'], 0):,}, "
            f"source {r['source']}"
        )


def _banner(views: dict[str, Any]) -> None:
    intervals = views["stale_intervals"]
    events = sum(i["events"] for i in intervals)
    minutes = sum(
        (dt.datetime.fromisoformat(i["end"]) - dt.datetime.fromisoformat(i["start"])) // MINUTE
        for i in intervals
    )
    print(f"stale banner: {len(intervals)} interval(s), {minutes} minute(s), {events:,} events")


def _drift(views: dict[str, Any]) -> None:
    drift = views.get("drift") or {}
    keys = ("impressions_p50", "impressions_p99", "clicks_p50", "clicks_p99")
    shown = ", ".join(
        f"{k} {100 * drift[k]:.1f} %" if drift.get(k) is not None else f"{k} -" for k in keys
    )
    print(f"drift headline ({drift.get('runs')} runs, {drift.get('buckets')} minutes): {shown}")
    for k in ("impressions_weighted", "clicks_weighted"):
        if drift.get(k) is not None:
            print(f"  {k}: {100 * drift[k]:.2f} %")


def _burst(client: httpx.Client, begin: dt.datetime, timeout_s: float) -> None:
    """2,000 events from ``begin``, sent now: the late events the API counts in their minutes
    (``stale_events`` per minute, summed), from before the burst until they are back within
    200 of it (a recompute counted them), with the time that took."""
    begin = begin.replace(second=0, microsecond=0)
    end = begin + dt.timedelta(minutes=3)  # 2,000 events at 20x the default clock: 100 s

    def late_in_burst() -> int:
        rows = _ctr(client, start=_iso(begin), end=_iso(end), granularity="minute")
        return sum(r["stale_events"] for r in rows)

    baseline = late_in_burst()
    ctr = str(Path(sys.executable).with_name("ctr"))
    command = [ctr, "produce", "--events", "2000", "--start", _iso(begin), "--clock-rate", "20"]
    sent = time.monotonic()
    subprocess.run(command, check=True, capture_output=True)
    peak = baseline
    while time.monotonic() - sent < timeout_s:
        late = late_in_burst()
        peak = max(peak, late)
        if peak >= baseline + 1000 and late <= baseline + 200:
            print(
                f"late burst at {begin:%H:%M}: {baseline} late events in its minutes before, "
                f"{peak} at the peak, {late} {time.monotonic() - sent:.0f} s after it was sent"
            )
            return
        time.sleep(10)
    state = "never counted as late" if peak < baseline + 1000 else "still late"
    print(
        f"late burst at {begin:%H:%M}: {state} after {timeout_s:.0f} s (before {baseline}, "
        f"peak {peak}, now {late_in_burst()})"
    )


if __name__ == "__main__":
    sys.exit(main())
