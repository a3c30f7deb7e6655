"""`python -m bench.demo_watch`: watch a running `make demo` for a while, sampling what must
stay bounded in the speed layer and how fresh the dashboard is.

Every ``--every`` seconds (default 60) for ``--minutes`` (default 60) it samples:

- **freshness**: one probe impression (campaign ``demo-watch-probe``, event time now) sent to the
  demo's topic, and the seconds until ``/api/v1/ctr`` returns it (what the dashboard would show),
  with the dashboard's "approximate (speed) through" minute and the speed job's last report;
- **speed/ctr**: its version, live data files and rows; over *closed* buckets (before the
  watermark, and closed for over two minutes: the job rolls up every ``SPEED_ROLLUP_SECONDS``,
  60 s, so the minute that closed last holds one row per micro-batch until then), the most rows
  one (bucket, dimensions) key has (1 when rolled up) and the most live files one closed minute is
  spread over; the rows of the open buckets;
- **its log and disk**: ``_delta_log`` commits and checkpoints, Parquet files on disk (live and
  removed-but-kept for as-of queries);
- the speed job's resident memory.

It prints one line per sample and, at the end, a table and a verdict per series: *bounded* when the
second half's maximum is within 10 % (or a small absolute slack) of the first half's. The
samples also go to ``bench/results/demo_watch.json``. Start the demo first (``make demo``;
``DEMO_RATE=1000 make demo`` for the hour at 1,000 events/s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import time
from pathlib import Path

import httpx
import orjson
import pyarrow.compute as pc

from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from lake.catalog import SPEED_CTR
from lake.settings import LakeSettings
from lake.speed_status import read_status
from runtime.kafka_settings import KafkaSettings
from speed_layer.tables import KEY
from speed_layer.tasks import closed_before

RESULTS = Path("bench/results")
# Buckets closed for less than this may not be rolled up yet (SPEED_ROLLUP_SECONDS, 60 s).
ROLLUP_GRACE = dt.timedelta(minutes=2)
PROBE_CAMPAIGN = "demo-watch-probe"
# Series that must not grow without bound, with the absolute slack allowed between the halves.
BOUNDED = {
    "live_files": 20,
    "closed_rows_per_key": 0,
    "closed_files_per_minute": 2,
    "open_rows": 20_000,
    "fresh_s": 2.0,
    "speed_rss_mb": 100,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.demo_watch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--demo-dir", type=Path, default=Path(os.environ.get("RUN_DIR", "run"))
                        / "demo", help="the demo's state directory (default run/demo)")  # fmt: skip
    args = parser.parse_args(argv)
    env = _demo_env(args.demo_dir / "env")
    lake = LakeSettings(lake_root=Path(env["LAKE_ROOT"]),
                        checkpoint_root=Path(env["CHECKPOINT_ROOT"]))  # fmt: skip
    kafka = KafkaSettings.from_environ(env)  # the demo's broker and its credentials
    api = f"http://127.0.0.1:{os.environ.get('API_PORT', '8000')}"
    headers = {"Authorization": f"Bearer {env['API_TOKEN']}"}
    samples: list[dict[str, object]] = []
    started = time.monotonic()
    with (
        EventProducer(kafka, ProducerSettings()) as producer,
        httpx.Client(base_url=api, headers=headers) as client,
    ):
        number = 0
        while time.monotonic() - started < args.minutes * 60:
            sample: dict[str, object] = {"minute": round((time.monotonic() - started) / 60, 1)}
            sample |= _freshness(client, producer, number)
            sample |= _speed_table(lake)
            sample["speed_rss_mb"] = _rss_mb(args.demo_dir / "speed.pid")
            samples.append(sample)
            print(json.dumps(sample), flush=True)
            number += 1
            time.sleep(max(0.0, started + number * args.every - time.monotonic()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "demo_watch.json").write_text(json.dumps(samples, indent=2) + "\n")
    return _verdict(samples)


def _demo_env(path: Path) -> dict[str, str]:
    """The variables the demo's env file exports."""
    if not path.exists():
        raise SystemExit(f"demo_watch: {path} not found; start the demo first (make demo)")
    found = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            for word in shlex.split(line[len("export ") :]):
                name, _, value = word.partition("=")
                found[name] = value
    return found


def _freshness(client: httpx.Client, producer: EventProducer, number: int) -> dict[str, object]:
    """Send one probe, poll the API until it answers it (at most 30 s)."""
    ad = f"watch-{os.getpid()}-{number:05d}"
    sent = time.time()
    probe = {
        "event_id": ad, "event_type": "impression", "event_time": int(sent * 1000),
        "impression_id": ad, "ad_id": ad, "campaign_id": PROBE_CAMPAIGN, "site_id": "watch",
        "country": "US", "device_type": "other", "user_id": "watch", "schema_version": 1,
    }  # fmt: skip
    producer.send_many([(orjson.dumps(probe), ad.encode())])
    producer.flush()
    start = dt.datetime.fromtimestamp(sent - 120, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    params = {"campaign_id": PROBE_CAMPAIGN, "ad_id": ad, "granularity": "all", "start": start}
    seen, body = None, {}
    while time.time() - sent < 30 and seen is None:
        try:
            response = client.get("/api/v1/ctr", params=params, timeout=10)
            response.raise_for_status()
            body = response.json()
            if body["rows"]:
                seen = time.time()
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    freshness = body.get("freshness") or {}
    now = dt.datetime.now(dt.UTC)
    updated = freshness.get("speed_updated_at")
    through = freshness.get("latest_speed_bucket")
    return {
        "fresh_s": round(seen - sent, 2) if seen is not None else None,
        "approximate_through": through,
        # The dashboard's "approximate (speed) through" minute is the current one (or, in the
        # first 5 s of a minute, the one before).
        "through_current": through is not None
        and _parse(through) >= (now - dt.timedelta(seconds=5)).replace(second=0, microsecond=0),
        "speed_report_age_s": round((now - _parse(updated)).total_seconds(), 1)
        if updated
        else None,
        "speed_lag_records": freshness.get("speed_lag_records"),
    }


def _parse(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _speed_table(lake: LakeSettings) -> dict[str, object]:
    from deltalake import DeltaTable

    path = Path(SPEED_CTR.path(lake))
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    table = DeltaTable(str(path))
    rows = table.to_pyarrow_table(columns=list(KEY))
    status = read_status(lake)
    watermark = status.watermark if status else None
    closed_end = (
        closed_before(int(watermark.timestamp() * 1000)) - ROLLUP_GRACE if watermark else None
    )
    closed_rows_per_key = closed_files_per_minute = 0
    open_rows = rows.num_rows
    if closed_end is not None and rows.num_rows:
        closed_mask = pc.less(rows.column("bucket_start"), closed_end)
        closed = rows.filter(closed_mask)
        open_rows = rows.num_rows - closed.num_rows
        if closed.num_rows:
            per_key = closed.group_by(list(KEY)).aggregate([([], "count_all")])
            closed_rows_per_key = pc.max(per_key.column("count_all")).as_py()
        closed_files_per_minute = _files_per_closed_minute(table, closed_end)
    log = path / "_delta_log"
    return {
        "version": table.version(),
        "live_files": len(table.file_uris()),
        "rows": rows.num_rows,
        "open_rows": open_rows,
        "closed_rows_per_key": closed_rows_per_key,
        "closed_files_per_minute": closed_files_per_minute,
        "log_commits": sum(1 for _ in log.glob("*.json")),
        "log_checkpoints": sum(1 for _ in log.glob("*.checkpoint*.parquet")),
        "files_on_disk": sum(1 for _ in path.rglob("*.parquet") if log not in _.parents),
    }


def _files_per_closed_minute(table: object, closed_end: dt.datetime) -> int:
    """The most live files whose bucket_start range holds one closed minute."""
    actions = table.get_add_actions(flatten=True)  # type: ignore[attr-defined]
    lows = actions.column("min.bucket_start").to_pylist()
    highs = actions.column("max.bucket_start").to_pylist()
    per_minute: dict[dt.datetime, int] = {}
    for low, high in zip(lows, highs, strict=True):
        if low is None or high is None or low >= closed_end:
            continue
        minute = low
        while minute <= min(high, closed_end - dt.timedelta(minutes=1)):
            per_minute[minute] = per_minute.get(minute, 0) + 1
            minute += dt.timedelta(minutes=1)
            if len(per_minute) > 100_000:
                break
    return max(per_minute.values(), default=0)


def _rss_mb(pid_file: Path) -> float | None:
    """Resident memory of the process group recorded in ``pid_file`` (the JVM and Python)."""
    try:
        group = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    total_kb = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return round(total_kb / 1024, 1)


def _verdict(samples: list[dict[str, object]]) -> int:
    """Print the table of the halves and whether each series stayed bounded; 1 if one grew."""
    half = len(samples) // 2
    grew = []
    print(f"\n{'series':<26}{'first half max':>16}{'second half max':>17}{'median':>10}  verdict")
    for name, slack in BOUNDED.items():
        values = [float(str(s[name])) for s in samples if s.get(name) is not None]
        first = [float(str(s[name])) for s in samples[:half] if s.get(name) is not None]
        second = [float(str(s[name])) for s in samples[half:] if s.get(name) is not None]
        if not first or not second:
            print(f"{name:<26}{'-':>16}{'-':>17}{'-':>10}  too few samples")
            continue
        bounded = max(second) <= max(first) * 1.1 + slack
        grew += [] if bounded else [name]
        verdict = "bounded" if bounded else "GREW"
        print(f"{name:<26}{max(first):>16,.1f}{max(second):>17,.1f}"
              f"{statistics.median(values):>10,.1f}  {verdict}")  # fmt: skip
    last = samples[-1] if samples else {}
    current = sum(1 for s in samples if s.get("through_current"))
    print(f"\nat the end: {last.get('log_commits')} log commits, {last.get('log_checkpoints')} "
          f"checkpoints, {last.get('files_on_disk')} Parquet files on disk "
          f"({last.get('live_files')} live); the dashboard's approximate minute was current in "
          f"{current} of {len(samples)} samples")  # fmt: skip
    return 1 if grew else 0


if __name__ == "__main__":
    raise SystemExit(main())
