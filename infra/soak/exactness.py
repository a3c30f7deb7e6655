"""The end of a soak: the traffic stopped, the topic drained, and the master dataset, the exact
view and the speed view compared with what the producer delivered."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from infra.soak.config import ROOT
from infra.soak.console import log
from infra.soak.demo import Demo
from infra.soak.processes import alive


def stop_producer(demo: Demo, ground_truth: Path, timeout_s: float = 120) -> None:
    pid = demo.pid("producer")
    if pid is None:
        raise SystemExit("soak: error: the producer is not running")
    log("stopping the traffic (the producer flushes and writes its ground truth)")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(1)
    if not ground_truth.exists():
        raise SystemExit(f"soak: error: the producer wrote no ground truth to {ground_truth}")


def drain(demo: Demo, timeout_s: float = 600) -> dict[str, int | None]:
    log("waiting for the archiver and the speed job to read the topic to its end")
    deadline = time.monotonic() + timeout_s
    lags = demo.lags()
    while time.monotonic() < deadline:
        lags = demo.lags()
        if all(v == 0 for v in lags.values()):
            break
        time.sleep(2)
    return lags


@dataclass
class Exactness:
    truth_events: int
    archived_rows: int
    archived_records: int  # distinct (partition, offset): Kafka records
    archived_distinct: int  # distinct event ids
    batch_rows_compared: int
    batch_rows_wrong: int
    batch_impressions: int
    batch_raw_clicks: int
    truth_impressions: int
    truth_clicks: int
    speed_impressions: int
    speed_minutes: int
    speed_error: float
    examples: list[str]

    @property
    def lost(self) -> int:
        return max(0, self.truth_events - self.archived_distinct)

    @property
    def duplicated(self) -> int:
        return self.archived_rows - self.archived_records

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.batch_rows_wrong == 0


def check_exactness(demo: Demo, ground_truth: Path, soak_window: tuple[int, int]) -> Exactness:
    """Recompute the batch view over every minute the producer wrote (late events included),
    then compare the master dataset, the exact view and the speed view with the truth."""
    from ingest.ground_truth import read_csv
    from lake.catalog import MASTER_EVENTS, batch_table
    from lake.coverage.log import read_runs
    from lake.duckdb_delta import delta_duckdb
    from lake.registry import read_registry
    from lake.settings import LakeSettings

    truth = read_csv(ground_truth)
    buckets = sorted({k[0] for k in truth})
    start = dt.datetime.fromtimestamp(buckets[0] / 1000, dt.UTC).replace(minute=0)
    end = dt.datetime.fromtimestamp(buckets[-1] / 1000 + 60, dt.UTC)
    iso = "%Y-%m-%dT%H:%M:%SZ"
    lake = LakeSettings(lake_root=demo.lake, checkpoint_root=demo.checkpoints)
    # What the batch layer covered while the speed layer ran: speed/ctr no longer holds it.
    covered_before = read_runs(lake).of(read_registry(lake).published("ctr").key)
    log(f"recomputing the exact view over {start:{iso}} .. {end:{iso}}")
    subprocess.run(
        [
            str(ROOT / ".venv/bin/ctr"),
            "batch",
            "--start",
            f"{start:{iso}}",
            "--end",
            f"{end:{iso}}",
            # Drained: the traffic has stopped, nothing more arrives, every minute is final.
            "--unsettled",
        ],
        env=demo.env,
        cwd=ROOT,
        check=True,
    )
    published = read_registry(lake).published("ctr")
    con = delta_duckdb()
    events = MASTER_EVENTS.path(lake)
    # Exactly once: each Kafka record (partition, offset) once; every delivered event's id there.
    rows, records, distinct = con.execute(
        f"""SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)),
                   count(DISTINCT event_id)
            FROM delta_scan('{events}')"""
    ).fetchone() or (0, 0, 0)
    clicks_col = "raw_clicks" if published.attribution else "clicks"
    batch = con.execute(
        f"""SELECT epoch_ms(bucket_start), campaign_id, ad_id, site_id, country, device_type,
                   sum(impressions), sum({clicks_col})
            FROM delta_scan('{batch_table(published).path(lake)}')
            WHERE bucket_start >= ? AND bucket_start < ?
            GROUP BY ALL""",
        [start, end],
    ).fetchall()
    view = {tuple(r[:6]): (int(r[6]), int(r[7])) for r in batch}
    keys = set(view) | {k for k, v in truth.items() if any(v)}
    wrong = [k for k in keys if view.get(k, (0, 0)) != truth.get(k, (0, 0))]
    low, high = soak_window
    # The speed layer's error, over the soak's minutes it still holds: the minutes the batch
    # layer covers are pruned from speed/ctr (the serving layer answers them from batch).
    speed_path = demo.lake / "speed" / "ctr"
    held = con.execute(
        f"""SELECT epoch_ms(bucket_start), sum(impressions) FROM delta_scan('{speed_path}')
            WHERE epoch_ms(bucket_start) >= ? AND epoch_ms(bucket_start) < ?
            GROUP BY 1""",
        [low, high],
    ).fetchall()
    uncovered = [
        (int(b), int(n))
        for b, n in held
        if not covered_before.covers(dt.datetime.fromtimestamp(int(b) / 1000, dt.UTC))
    ]
    minutes = {b for b, _ in uncovered}
    speed_impressions = sum(n for _, n in uncovered)
    truth_window = sum(v[0] for k, v in truth.items() if k[0] in minutes)
    return Exactness(
        truth_events=sum(i + c for i, c in truth.values()),
        archived_rows=int(rows),
        archived_records=int(records),
        archived_distinct=int(distinct),
        batch_rows_compared=len(keys),
        batch_rows_wrong=len(wrong),
        batch_impressions=sum(v[0] for v in view.values()),
        batch_raw_clicks=sum(v[1] for v in view.values()),
        truth_impressions=sum(v[0] for v in truth.values()),
        truth_clicks=sum(v[1] for v in truth.values()),
        speed_impressions=speed_impressions,
        speed_minutes=len(minutes),
        speed_error=(speed_impressions - truth_window) / truth_window if truth_window else 0.0,
        examples=[f"{k}: view {view.get(k)} truth {truth.get(k)}" for k in sorted(wrong)[:5]],
    )
