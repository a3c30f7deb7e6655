"""The speed benchmark's figures read from what a run left: when each probe was committed
(speed/ctr's log), where the time from a commit to its answer went, the job's per-batch phases
(its log), the backlog's drain (its log and Spark's event log), the attribution across the
restart, and speed/ctr's files.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pyarrow.parquet as pq

from bench.scale import event_log, micro_batches
from bench.speed_traffic import RECORDER, Phase
from lake.settings import LakeSettings

RESTART_BUCKETS_S = 60  # the buckets of the last minute before the stop, for attribution
_PHASES_LINE = re.compile(r"batch (\d+) phases \(ms\): (\{.*\})")
_PASS_LINE = re.compile(r"maintenance pass \(ms\): (\{.*\})")


def visibility(table: str) -> dict[str, tuple[float, int]]:
    """ad_id -> (epoch seconds, version) of the first commit whose added files hold a probe
    row."""
    log_dir = Path(table) / "_delta_log"
    seen: dict[str, tuple[float, int]] = {}
    for entry in sorted(log_dir.glob("*.json")):
        committed_at = None
        added = []
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                committed_at = action["commitInfo"].get("timestamp")
            elif "add" in action:
                added.append(action["add"]["path"])
        if committed_at is None:
            continue
        for path in added:
            ads = pq.read_table(Path(table) / path, columns=["ad_id"]).column("ad_id")
            for ad in ads.to_pylist():
                if ad.startswith("probe-") and ad not in seen:
                    seen[ad] = (committed_at / 1000, int(entry.name.split(".")[0]))
    return seen


def api_share(
    phase: Phase, visible: dict[str, tuple[float, int]], requests: list[tuple[float, float, int]]
) -> dict[str, float]:
    """Where the time from a probe's commit to its answer goes (medians, ms): ``snapshot``, from
    the commit until a request that reads its version is sent (the API's snapshot refresh, plus
    up to one poll interval), and ``query``, that request's own time; ``request`` is the median
    time of every request of the phase."""
    snapshot, query = [], []
    for ad in phase.probes:
        if ad not in visible:
            continue
        committed_at, version = visible[ad]
        first = next(((sent, answered) for sent, answered, read in requests
                      if read >= version and answered >= committed_at), None)  # fmt: skip
        if first is not None:
            snapshot.append(max(0.0, first[0] - committed_at) * 1000)
            query.append((first[1] - first[0]) * 1000)
    start = min(phase.probes.values(), default=0.0)
    end = max(phase.probes.values(), default=0.0) + 5
    durations = [(a - s) * 1000 for s, a, _ in requests if start <= s <= end]
    return {
        "snapshot": round(statistics.median(snapshot), 1) if snapshot else float("nan"),
        "query": round(statistics.median(query), 1) if query else float("nan"),
        "request": round(statistics.median(durations), 1) if durations else float("nan"),
    }


def phases_per_batch(log: Path) -> dict[int, dict[str, int]]:
    """batch id -> its phases, from the job's ``batch N phases (ms): {...}`` log lines."""
    found: dict[int, dict[str, int]] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = _PHASES_LINE.search(line)
        if match:
            try:
                found[int(match.group(1))] = json.loads(match.group(2))
            except ValueError:
                continue
    return found


def maintenance_passes(log: Path) -> list[dict[str, int]]:
    """The job's maintenance passes (ms per part), from its ``maintenance pass (ms): {...}``
    log lines: they run beside the micro-batches, so no batch's phases hold them."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = _PASS_LINE.search(line)
        if match:
            try:
                found.append(json.loads(match.group(1)))
            except ValueError:
                continue
    return found


def table_files(table: str) -> dict[str, int]:
    """Data files, rows and log entries of speed/ctr's latest version."""
    from deltalake import DeltaTable

    delta = DeltaTable(table)
    log_dir = Path(table) / "_delta_log"
    return {
        "version": delta.version(),
        "files": len(delta.file_uris()),
        "rows": delta.to_pyarrow_dataset().count_rows(),
        "log_json": len(list(log_dir.glob("*.json"))),
        "log_checkpoints": len(list(log_dir.glob("*.checkpoint*.parquet"))),
    }


def backlog_figures(log: Path, events_log: Path) -> dict[str, object]:
    """The restarted job's micro-batches over the backlog: the rate (rows over the batches'
    durations, Spark's own figure per batch) and the bytes its tasks returned to the driver
    (every task's ``Result Size`` in the event log, the whole application)."""
    rows, batches, ms = micro_batches(log)
    _, result_bytes, _, _ = event_log(events_log)
    return {
        "events": rows,
        "batches": batches,
        "rate": round(rows / (ms / 1000)) if ms else None,
        "result_bytes": result_bytes,
        "result_bytes_per_million": round(result_bytes / (rows / 1e6)) if rows else None,
    }


def restart_attribution(lake: LakeSettings, stopped_ms: int) -> dict[str, object]:
    """Attributed clicks of the impressions of the last minute(s) before the stop, whose
    clicks came on both sides of the restart: speed/ctr's against the exact count (the batch
    layer's rule over the same events)."""
    from deltalake import DeltaTable

    from speed_layer.job import ATTRIBUTION

    end = stopped_ms // 60_000 * 60_000  # the bucket still filling at the stop is left out
    start = end - RESTART_BUCKETS_S * 1000
    exact = RECORDER.attributed(start, end, int(ATTRIBUTION.total_seconds() * 1000))
    rows = (
        DeltaTable(lake.table("speed/ctr"))
        .to_pyarrow_table(columns=["bucket_start", "campaign_id", "attributed_clicks"])
        .to_pylist()
    )
    speed: dict[int, int] = {}
    for r in rows:
        bucket = int(r["bucket_start"].timestamp() * 1000)
        if start <= bucket < end and r["campaign_id"] != "probe":
            speed[bucket] = speed.get(bucket, 0) + (r["attributed_clicks"] or 0)
    exact_total, speed_total = sum(exact.values()), sum(speed.values())
    return {
        "buckets": len(exact),
        "exact": exact_total,
        "speed": speed_total,
        "error": round(abs(speed_total - exact_total) / exact_total, 4) if exact_total else None,
    }
