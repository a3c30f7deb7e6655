"""The attribution-state benchmark's figures: each side's per-batch latency and where it goes,
what each writes to and keeps on the store, each cold start, Spark's state checked against
ours, and the two side by side (printed; the returned dict is bench/results/state.json)."""

from __future__ import annotations

import datetime as dt
import statistics
from typing import TYPE_CHECKING, Any

from bench.state_ours import Call, OursRun
from bench.state_traffic import BatchPlan

if TYPE_CHECKING:
    from bench.state import StateBenchSettings

BucketTotals = dict[int, list[int]]
# What Spark's RocksDB provider reports of a load (the restart's batch).
LOAD_METRICS = ("rocksdbLoadLatencyMs", "rocksdbLoadFromSnapshotLatencyMs",
                "rocksdbReplayChangeLogLatencyMs", "rocksdbNumReplayChangelogFiles",
                "rocksdbNumLoadedFromDfs", "rocksdbFilesCopied", "rocksdbBytesCopied")  # fmt: skip
# Spark's phases of a micro-batch (StreamingQueryProgress.durationMs), as recorded.
PHASES = (
    "triggerExecution",
    "addBatch",
    "walCommit",
    "commitOffsets",
    "latestOffset",
    "queryPlanning",
    "getBatch",
)


def report(
    settings: StateBenchSettings,
    plans: list[BatchPlan],
    ours: dict[str, OursRun],
    spark: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    warm_seconds = len(plans) - 1  # one batch per second of traffic
    spark_batches = settings.spark_batches
    result: dict[str, Any] = {
        "minutes": settings.minutes,
        "spark_minutes": spark_batches // 60,
        "rate": settings.rate,
        "partitions": settings.partitions,
        "watermark": settings.watermark,
        "events": sum(p.events for p in plans),
        "batches": len(plans) - 1,
        "ours": {label: ours_summary(run, warm_seconds) for label, run in ours.items()},
        "spark": {mode: spark_summary(raw, plans) for mode, raw in spark.items()},
    }
    base = spark["baseline"]
    result["spark_state_cost"] = {
        mode: state_cost(raw, base) for mode, raw in spark.items() if mode != "baseline"
    }
    result["correctness"] = correctness(ours, spark, spark_batches)
    result["comparison"] = comparison(result)
    _print(result)
    return result


def ours_summary(result: OursRun, seconds: float) -> dict[str, Any]:
    """The run's figures (milliseconds; ``seconds``: the event time the warm batches span)."""
    calls = result.calls
    warm = result.batch_ms[1:]  # the first batch lists an empty store: not a warm batch
    snapshots = [c.snapshot_ms for c in calls if c.snapshotted]
    cold = result.cold
    return {
        "snapshot_every": result.snapshot_every,
        "batches": len(result.batch_ms),
        "batch_ms": percentiles(warm),
        "phase_ms_per_batch": {
            phase: percentiles(_per_batch(calls, phase))
            for phase in ("read_ms", "attribute_ms", "write_ms", "snapshot_ms")
        },
        "call_ms": percentiles([c.total_ms for c in calls]),
        "snapshots": len(snapshots),
        "snapshot_ms": percentiles(snapshots),
        "expire_ms": percentiles(result.expiries_ms),
        "objects_written_per_s": result.requests.writes / seconds if seconds else None,
        "requests": result.requests.__dict__,
        "store_objects_max": max((s[0] for s in result.store_samples), default=0),
        "store_bytes_max": max((s[1] for s in result.store_samples), default=0),
        "store_at_cold_start": {"objects": result.cold_listed[0], "bytes": result.cold_listed[1]},
        "cold_start": {
            "per_partition": [
                {
                    "partition": c.partition,
                    "objects_read": c.objects_read,
                    "bytes_read": c.bytes_read,
                    "seconds": round(c.total_ms / 1000, 3),
                    "read_seconds": round(c.read_ms / 1000, 3),
                }
                for c in cold
            ],
            "objects_read_max": max((c.objects_read for c in cold), default=0),
            "seconds_max": round(max((c.total_ms for c in cold), default=0) / 1000, 3),
            "seconds_total": round(sum(c.total_ms for c in cold) / 1000, 3),
            "requests": result.cold_requests.__dict__,
        },
    }


def _per_batch(calls: list[Call], phase: str) -> list[float]:
    per: dict[int, float] = {}
    for call in calls:
        value = call.attribute_ms if phase == "attribute_ms" else getattr(call, phase)
        per[call.batch] = per.get(call.batch, 0.0) + value
    return [v for batch, v in sorted(per.items()) if batch > 0]


def spark_summary(raw: dict[str, Any], plans: list[BatchPlan]) -> dict[str, Any]:
    """One mode's run (its batches, the first apart) and restart. The baseline's watermark is
    not checked: with no stateful operator Spark pushes the click filter below the watermark,
    which then moves only in batches with clicks (and nothing uses it)."""
    batches = _data_batches(raw["run"])
    warm = [b for b in batches if b["file"] > 0]
    operator = [b["stateOperators"][0] for b in warm if b["stateOperators"]]
    last = operator[-1] if operator else {}
    trigger = [b["durationMs"]["triggerExecution"] for b in warm]
    stateful = any(b["stateOperators"] for b in batches)
    mismatched = [
        b["file"]
        for b in batches
        if stateful and _ms(b["watermark"]) != plans[b["file"]].watermark_ms
    ]
    restart = raw["restart"]
    first = _data_batches(restart)
    hadoop = raw["run"]["hadoop"]
    return {
        "batches": len(batches),
        "first_batch_ms": batches[0]["durationMs"]["triggerExecution"] if batches else None,
        "phase_ms": {
            phase: percentiles([b["durationMs"].get(phase, 0) for b in warm]) for phase in PHASES
        },
        "keeps_the_1s_trigger": bool(trigger) and percentile(trigger, 0.95) <= 1000,
        "state_operator_ms": {
            name: percentiles([o.get(name) or 0 for o in operator])
            for name in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")
        },
        "state_rows_at_end": last.get("numRowsTotal"),
        "state_memory_bytes_at_end": last.get("memoryUsedBytes"),
        "state_custom_metrics_at_end": last.get("customMetrics"),
        "watermarks_unlike_the_plan": mismatched[:10],
        "write_ops_per_batch": hadoop.get("write_ops", 0) / max(1, len(batches)),
        "bytes_written_per_batch": hadoop.get("bytes_written", 0) / max(1, len(batches)),
        "hadoop": hadoop,
        "session_s": raw["run"]["session_s"],
        "conf": raw["run"]["conf"],
        "checkpoint": raw["checkpoint"],
        "restart": {
            "session_s": restart["session_s"],
            "first_batch_s": restart["first_batch_s"],
            "batch_ms": first[0]["durationMs"] if first else None,
            "state_load": _state_load(first[0]) if first else None,
            "hadoop": restart["hadoop"],
        },
    }


def _state_load(batch: dict[str, Any]) -> dict[str, Any] | None:
    """The restart batch's state operator: its updates' time and what Spark reports of the
    RocksDB instances' load (as named in its metrics)."""
    if not batch["stateOperators"]:
        return None
    operator = batch["stateOperators"][0]
    metrics = operator.get("customMetrics") or {}
    return {
        "allUpdatesTimeMs": operator.get("allUpdatesTimeMs"),
        "commitTimeMs": operator.get("commitTimeMs"),
        **{k: v for k, v in sorted(metrics.items()) if k in LOAD_METRICS},
    }


def state_cost(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """What the state adds to the engine, batch by batch: the mode's batch less the baseline's
    batch over the same file, and the restarts likewise."""
    mine = {b["file"]: b["durationMs"]["triggerExecution"] for b in _data_batches(raw["run"])}
    theirs = {b["file"]: b["durationMs"]["triggerExecution"] for b in _data_batches(base["run"])}
    paired = [mine[b] - theirs[b] for b in sorted(mine) if b > 0 and b in theirs]
    writes = raw["run"]["hadoop"].get("write_ops", 0) - base["run"]["hadoop"].get("write_ops", 0)
    reads = {
        k: raw["restart"]["hadoop"].get(k, 0) - base["restart"]["hadoop"].get(k, 0)
        for k in ("read_ops", "bytes_read")
    }
    return {
        "batch_ms": percentiles(paired),
        "write_ops_per_batch": writes / max(1, len(mine)),
        "restart_reads": reads,
    }


def correctness(
    ours: dict[str, OursRun], spark: dict[str, dict[str, Any]], batches: int
) -> dict[str, Any]:
    """Clicks attributed, orphaned and repeated per impression bucket over batches 0..``batches``
    (the last: Spark's restart, and ours' cold start when it is the same batch), each Spark state
    mode against ours with snapshots; ours without snapshots against ours with."""
    reference = _summed(ours["snapshots"].totals, batches)
    found: dict[str, Any] = {
        "batches": batches + 1,
        "ours": _grand(reference),
        "ours_without_snapshots_equal": _summed(ours["no_snapshots"].totals, batches) == reference,
    }
    equal = found["ours_without_snapshots_equal"]
    for mode, raw in spark.items():
        if mode == "baseline":
            continue
        per_batch = {**_per_file(raw["run"]), **_per_file(raw["restart"])}
        theirs = _summed(per_batch, batches)
        differences = [
            {"bucket": _iso(k), "ours": reference.get(k), "spark": theirs.get(k)}
            for k in sorted(set(reference) | set(theirs))
            if reference.get(k, [0, 0, 0]) != theirs.get(k, [0, 0, 0])
        ]
        found[mode] = {
            "totals": _grand(theirs),
            "equal": not differences,
            "differences": differences[:10],
        }
        equal = equal and not differences
    found["equal"] = equal
    return found


def comparison(result: dict[str, Any]) -> dict[str, Any]:
    """Ours (with snapshots) and each Spark state mode, figure by figure, with the ratio
    Spark / ours (above 1: ours is ahead)."""
    mine = result["ours"]["snapshots"]
    rows: dict[str, Any] = {}
    for mode, cost in result["spark_state_cost"].items():
        theirs = result["spark"][mode]
        restore = [p["restore"]["objects"] for p in theirs["checkpoint"]["partitions"].values()]
        figures = {
            "batch p50 (ms): ours / Spark's state share": (
                mine["batch_ms"]["p50"],
                cost["batch_ms"]["p50"],
            ),
            "batch p95 (ms): ours / Spark's state share": (
                mine["batch_ms"]["p95"],
                cost["batch_ms"]["p95"],
            ),
            "batch p95 (ms): ours / Spark's whole batch": (
                mine["batch_ms"]["p95"],
                theirs["phase_ms"]["triggerExecution"]["p95"],
            ),
            "writes per batch (ours: objects; Spark: Hadoop write ops)": (
                mine["objects_written_per_s"],
                cost["write_ops_per_batch"],
            ),
            "state objects on the store": (
                mine["store_at_cold_start"]["objects"],
                theirs["checkpoint"]["state_objects"],
            ),
            "state bytes on the store": (
                mine["store_at_cold_start"]["bytes"],
                theirs["checkpoint"]["state_bytes"],
            ),
            "cold start: objects per partition (max)": (
                mine["cold_start"]["objects_read_max"],
                max(restore, default=None),
            ),
            "cold start, the first batch (ms): ours' partitions / Spark's restart batch": (
                mine["cold_start"]["seconds_total"] * 1000,
                (theirs["restart"]["batch_ms"] or {}).get("triggerExecution"),
            ),
        }
        rows[mode] = {
            name: {"ours": a, "spark": b, "ratio": _ratio(b, a)} for name, (a, b) in figures.items()
        }
    return rows


def _print(result: dict[str, Any]) -> None:
    print(
        f"\nbench state: {result['events']:,} events, {result['batches']:,} one-second "
        f"micro-batches ({result['minutes']} min) over {result['partitions']} partition(s); "
        f"Spark over the first {result['spark_minutes']} min"
    )
    for label, ours in result["ours"].items():
        phases = ours["phase_ms_per_batch"]
        cold = ours["cold_start"]
        print(
            f"\nours, {label.replace('_', ' ')} (every {ours['snapshot_every']:,}): batch p50 "
            f"{ours['batch_ms']['p50']} ms, p95 {ours['batch_ms']['p95']} ms, max "
            f"{ours['batch_ms']['max']} ms (partitions in series, one core)\n"
            f"  per batch, p50/p95 ms: read {_pp(phases['read_ms'])}, attribute "
            f"{_pp(phases['attribute_ms'])}, write {_pp(phases['write_ms'])}, snapshot "
            f"{_pp(phases['snapshot_ms'])}; a snapshot {_pp(ours['snapshot_ms'])} "
            f"({ours['snapshots']} written); expiry {_pp(ours['expire_ms'])}\n"
            f"  objects written per batch {ours['objects_written_per_s']:.2f} (and "
            f"{ours['requests']['dirs'] / max(1, ours['batches']):.2f} create_dir calls, "
            f"{ours['requests']['dirs_ms'] / max(1, ours['batches']):.1f} ms of the write); on "
            "the store at "
            f"the cold start {ours['store_at_cold_start']['objects']:,} objects, "
            f"{ours['store_at_cold_start']['bytes'] / 1e6:,.1f} MB (max "
            f"{ours['store_objects_max']:,}, {ours['store_bytes_max'] / 1e6:,.1f} MB)\n"
            f"  cold start: at most {cold['objects_read_max']} objects read per partition, "
            f"{cold['seconds_max']} s at most, {cold['seconds_total']} s for all partitions"
        )
    for mode, spark in result["spark"].items():
        phases = spark["phase_ms"]
        operator = spark["state_operator_ms"]
        checkpoint = spark["checkpoint"]
        restart = spark["restart"]
        print(
            f"\nSpark, {mode}: batch p50/p95 {_pp(phases['triggerExecution'])} ms (addBatch "
            f"{_pp(phases['addBatch'])}, walCommit {_pp(phases['walCommit'])}, commitOffsets "
            f"{_pp(phases['commitOffsets'])}); the first {spark['first_batch_ms']}; keeps the "
            f"1-s trigger: {spark['keeps_the_1s_trigger']}\n"
            f"  write ops per batch {spark['write_ops_per_batch']:.1f}, "
            f"{spark['bytes_written_per_batch'] / 1e3:,.1f} kB; checkpoint "
            f"{checkpoint['objects']:,} objects, {checkpoint['bytes'] / 1e6:,.1f} MB (state "
            f"{checkpoint['state_objects']:,}, {checkpoint['state_bytes'] / 1e6:,.1f} MB)\n"
            f"  restart: session {restart['session_s']} s, query start to first batch "
            f"{restart['first_batch_s']} s, the batch {restart['batch_ms']} ms; Hadoop "
            f"{restart['hadoop']}\n  the state's load (Spark's metrics): {restart['state_load']}"
        )
        if mode != "baseline":
            restore = {p: r["restore"] for p, r in checkpoint["partitions"].items()}
            print(
                f"  state operator p50/p95 ms: updates {_pp(operator['allUpdatesTimeMs'])}, "
                f"removals {_pp(operator['allRemovalsTimeMs'])}, commit "
                f"{_pp(operator['commitTimeMs'])}; rows at the end {spark['state_rows_at_end']}\n"
                f"  a cold load per partition (newest snapshot, its SSTs, changelogs after): "
                + ", ".join(
                    f"{p}: {r['objects']} objects {r['bytes'] / 1e6:.1f} MB"
                    for p, r in restore.items()
                )
            )
        if unlike := spark["watermarks_unlike_the_plan"]:
            print(f"  a watermark unlike the speed job's in batches {unlike}")
    check = result["correctness"]
    print(
        f"\ncheck over {check['batches']:,} batches: ours {check['ours']}; ours without snapshots "
        f"equal: {check['ours_without_snapshots_equal']}"
    )
    for mode in result["spark_state_cost"]:
        mine = check[mode]
        print(
            f"  Spark {mode}: {mine['totals']}, equal: {mine['equal']}"
            + (f"; differences {mine['differences']}" if mine["differences"] else "")
        )
    for mode, rows in result["comparison"].items():
        print(f"\nours vs Spark {mode} (ratio Spark / ours):")
        for name, row in rows.items():
            print(
                f"  {name:<72} {_num(row['ours']):>12} {_num(row['spark']):>12} "
                f"{_num(row['ratio']):>8}"
            )


def _data_batches(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The batches that took a file, in file order."""
    return sorted((b for b in raw["progress"] if b["file"] is not None), key=lambda b: b["file"])


def _per_file(raw: dict[str, Any]) -> dict[int, BucketTotals]:
    """The sink's totals per batch file (the totals are per batch id)."""
    files = {int(b["batchId"]): int(b["file"]) for b in _data_batches(raw)}
    return {files[int(b)]: _buckets(t) for b, t in raw["totals"].items() if int(b) in files}


def _summed(per_batch: dict[int, BucketTotals], batches: int) -> BucketTotals:
    summed: BucketTotals = {}
    for batch, totals in per_batch.items():
        if batch > batches:
            continue
        for bucket, measures in totals.items():
            into = summed.setdefault(int(bucket), [0, 0, 0])
            for index, value in enumerate(measures):
                into[index] += value
    return {k: v for k, v in summed.items() if any(v)}


def _buckets(totals: dict[str, list[int]]) -> BucketTotals:
    return {int(k): v for k, v in totals.items()}


def _grand(totals: BucketTotals) -> dict[str, int]:
    names = ("attributed_clicks", "orphan_clicks", "repeat_clicks")
    return {name: sum(v[i] for v in totals.values()) for i, name in enumerate(names)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None}
    return {
        "p50": round(statistics.median(values), 1),
        "p95": round(percentile(values, 0.95), 1),
        "max": round(max(values), 1),
    }


def _ms(iso: str | None) -> int:
    if not iso:
        return 0
    moment = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return round(moment.timestamp() * 1000)


def _iso(bucket_ms: int) -> str:
    return dt.datetime.fromtimestamp(bucket_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _ratio(theirs: float | None, mine: float | None) -> float | None:
    if theirs is None or mine is None or mine == 0:
        return None
    return round(theirs / mine, 2)


def _pp(figures: dict[str, float | None]) -> str:
    return f"{figures['p50']}/{figures['p95']}"


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
