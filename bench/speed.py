"""Speed-layer freshness: time from produce to visibility in speed/ctr, at a steady rate.

`ctr speed` runs as its own process (default settings: 1 s trigger, local[2]) on a broker of
its own. Traffic is produced at 5,000 events/s for 60 s with event times of "now"; every 250 ms
one *probe* event with a unique ``ad_id`` goes out with the traffic. A probe is visible when the
first Delta commit whose added files hold its row lands: its latency is that commit's
timestamp minus the probe's send time (same machine clock). Then steps of higher rates (20 s
each) find the highest rate at which the job keeps up (offsets behind stay bounded).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from infra.broker import scratch_broker
from ingest.producer import EventProducer
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from runtime.topics import ensure_topics

RESULTS = Path("bench/results")
CTR = str(Path(sys.executable).with_name("ctr"))
MAIN_RATE = 5_000
MAIN_SECONDS = 60.0
STEP_RATES = (10_000, 20_000, 40_000)
STEP_SECONDS = 20.0
PROBE_EVERY_S = 0.25


@dataclass
class Phase:
    rate: int
    seconds: float
    probes: dict[str, float] = field(default_factory=dict)  # ad_id -> sent at (epoch s)
    produced: int = 0
    behind: list[tuple[float, int]] = field(default_factory=list)  # (elapsed s, offsets)

    @property
    def achieved_rate(self) -> float:
        return self.produced / self.seconds


def main(events: int | None = None) -> dict[str, object]:
    del events  # rate and duration define this benchmark
    with tempfile.TemporaryDirectory(prefix="ctr-bench-speed-") as scratch:
        work = Path(scratch)
        kafka = KafkaSettings()
        if not kafka.is_loopback:
            return _run(kafka, work)
        with scratch_broker(work / "run", topic="bench-speed") as local:
            return _run(local, work)


def _run(kafka: KafkaSettings, work: Path) -> dict[str, object]:
    ensure_topics(kafka)
    lake = LakeSettings(lake_root=work / "lake", checkpoint_root=work / "checkpoints")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "KAFKA_TOPIC": kafka.topic,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "SPEED_MAINTENANCE_SECONDS": "3600",  # keep every file for the post-run scan
    }
    log = (work / "speed.log").open("w")
    job = subprocess.Popen([CTR, "speed"], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)  # fmt: skip
    try:
        generator = TrafficGenerator(
            TrafficConfig(seed=11, start_ms=int(time.time() * 1000), events_per_second=MAIN_RATE)
        )
        with EventProducer(kafka) as producer:
            print("bench speed: warming up (job start + 15 s of traffic) ...", flush=True)
            warmup = Phase(MAIN_RATE, 15.0)
            _wait_for_status(lake, job, producer, generator)
            _produce_phase(warmup, producer, generator, lake, "warmup")
            phases = [Phase(MAIN_RATE, MAIN_SECONDS)]
            phases += [Phase(rate, STEP_SECONDS) for rate in STEP_RATES]
            for number, phase in enumerate(phases):
                print(f"bench speed: {phase.rate:,} events/s for {phase.seconds:.0f} s ...",
                      flush=True)  # fmt: skip
                _produce_phase(phase, producer, generator, lake, f"p{number}")
                _drain(lake, job)
        visible = _visibility(lake.table("speed/ctr"))
    finally:
        job.terminate()
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, 9)
        log.close()
    return _report(phases, visible, work)


def _wait_for_status(
    lake: LakeSettings, job: subprocess.Popen[bytes], producer: EventProducer,
    generator: TrafficGenerator,
) -> None:  # fmt: skip
    status = lake.checkpoint_root / "speed.status.json"
    deadline = time.monotonic() + 120
    while not status.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("ctr speed did not start (see its log)")
        _send(producer, generator, 100)
        time.sleep(0.5)


def _send(producer: EventProducer, generator: TrafficGenerator, n: int) -> int:
    records = [next(generator) for _ in range(n)]
    return producer.send_many((r.value, r.key) for r in records)


def _produce_phase(
    phase: Phase, producer: EventProducer, generator: TrafficGenerator, lake: LakeSettings,
    tag: str,
) -> None:  # fmt: skip
    tick = 0.02
    per_tick = max(1, round(phase.rate * tick))
    started = time.monotonic()
    next_tick = next_probe = next_sample = started
    probe_number = 0
    while (now := time.monotonic()) - started < phase.seconds:
        if now >= next_probe:
            ad = f"probe-{tag}-{probe_number:05d}"
            sent_at = time.time()
            producer.send_many([(_probe(ad, sent_at), ad.encode())])
            phase.probes[ad] = sent_at
            probe_number += 1
            next_probe += PROBE_EVERY_S
        if now >= next_sample:
            behind = _offsets_behind(lake)
            if behind is not None:
                phase.behind.append((now - started, behind))
            next_sample += 1.0
        phase.produced += _send(producer, generator, per_tick)
        producer.poll(0)
        next_tick += tick
        time.sleep(max(0.0, next_tick - time.monotonic()))
    producer.flush()


def _probe(ad: str, sent_at: float) -> bytes:
    return orjson.dumps(
        {
            "event_id": ad, "event_type": "impression", "event_time": int(sent_at * 1000),
            "impression_id": ad, "ad_id": ad, "campaign_id": "probe", "site_id": "probe",
            "country": "US", "device_type": "other", "user_id": "probe", "schema_version": 1,
        }
    )  # fmt: skip


def _offsets_behind(lake: LakeSettings) -> int | None:
    try:
        status = json.loads((lake.checkpoint_root / "speed.status.json").read_text())
    except (OSError, ValueError):
        return None
    behind = status.get("offsets_behind")
    return int(behind) if behind is not None else None


def _drain(lake: LakeSettings, job: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Let the job catch up before the next phase (so phases do not blur)."""
    deadline = time.monotonic() + timeout_s
    time.sleep(2)
    while time.monotonic() < deadline and job.poll() is None:
        if _offsets_behind(lake) == 0:
            return
        time.sleep(0.5)


def _visibility(table: str) -> dict[str, float]:
    """ad_id -> epoch seconds of the first commit whose added files hold a probe row."""
    log_dir = Path(table) / "_delta_log"
    seen: dict[str, float] = {}
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
                    seen[ad] = committed_at / 1000
    return seen


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _report(phases: list[Phase], visible: dict[str, float], work: Path) -> dict[str, object]:
    rows = []
    for phase in phases:
        latencies = [visible[ad] - sent for ad, sent in phase.probes.items() if ad in visible]
        missing = len(phase.probes) - len(latencies)
        behind = [b for _, b in phase.behind]
        third = max(1, len(behind) // 3)
        # Keeping up: the backlog at the end of the phase is no bigger than at its start
        # (plus two seconds of input) and never above ~3 s of input.
        bounded = bool(behind) and max(behind) <= 3 * phase.rate
        flat = bool(behind) and max(behind[-third:]) <= max(behind[:third]) + 2 * phase.rate
        rows.append(
            {
                "rate": phase.rate,
                "achieved_rate": round(phase.achieved_rate),
                "seconds": phase.seconds,
                "probes": len(phase.probes),
                "missing": missing,
                "p50_s": round(statistics.median(latencies), 3) if latencies else None,
                "p95_s": round(_percentile(latencies, 0.95), 3) if latencies else None,
                "max_s": round(max(latencies), 3) if latencies else None,
                "max_offsets_behind": max(behind) if behind else None,
                "kept_up": bounded and flat and missing == 0,
            }
        )
    main_row = rows[0]
    sustained = max((int(str(r["achieved_rate"])) for r in rows if r["kept_up"]), default=0)
    result: dict[str, object] = {
        "benchmark": "speed",
        "goal": "p95 <= 3 s at 5,000 events/s",
        "p50_s": main_row["p50_s"],
        "p95_s": main_row["p95_s"],
        "max_s": main_row["max_s"],
        "highest_sustained_rate": sustained,
        "phases": rows,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, local[2]",
    }
    print(f"bench speed: {MAIN_RATE:,} events/s for {MAIN_SECONDS:.0f} s: probe latency "
          f"p50 {main_row['p50_s']} s, p95 {main_row['p95_s']} s, max {main_row['max_s']} s "
          "(goal p95 <= 3 s)")  # fmt: skip
    for r in rows:
        print(f"  {r['rate']:>6,}/s (achieved {r['achieved_rate']:,}/s): p50 {r['p50_s']} s, "
              f"p95 {r['p95_s']} s, max {r['max_s']} s, max behind {r['max_offsets_behind']}, "
              f"missing {r['missing']}, kept up: {r['kept_up']}")  # fmt: skip
    print(f"bench speed: highest rate sustained without growing lag: {sustained:,} events/s")
    batches = _batch_durations(work / "speed.log")
    if batches:
        result["batch_ms_median"] = statistics.median(batches)
        print(f"  micro-batch duration: median {statistics.median(batches):,.0f} ms")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _batch_durations(log: Path) -> list[float]:
    """Durations the job logged per batch (``... N ms, ...`` lines), if its log has them."""
    durations = []
    for line in log.read_text(errors="replace").splitlines():
        if "rows/s processed," in line:
            try:
                durations.append(float(line.split("rows/s processed,")[1].split("ms")[0]))
            except (IndexError, ValueError):
                continue
    return durations
