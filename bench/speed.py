"""Speed-layer freshness, produce -> visible in speed/ctr and through the HTTP API, at steady rates.

`ctr speed` runs as its own process (default settings: 1 s trigger, local[2]) on a broker of
its own, and `ctr serve` beside it over the same lake. Every 250 ms one *probe* event with a
unique ``ad_id`` goes out with the traffic (event time "now"). A probe is

- *committed* when the first Delta commit whose added files hold its row lands (that commit's
  timestamp minus the probe's send time, same machine clock), and
- *served* when ``GET /api/v1/ctr?campaign_id=probe&group_by=ad_id`` first returns it: what a
  dashboard sees (polled every 100 ms, so up to ~0.1 s of the figure is the poll interval).

Phases: 2,000 events/s for 20 s (live-sized micro-batches of ~2,000 records at a 1 s trigger),
5,000 events/s for 60 s (the freshness goal), then steps of higher rates (20 s each) find the
highest rate at which the job keeps up (offsets behind stay bounded). The job logs where each
micro-batch's time goes (Spark's trigger phases, then its own: the view's Spark job, each
write): the benchmark prints the median per phase. Last, in the benchmark's own SparkSession,
the view's Spark job is taken apart on 2,000 records: Kafka read, + parsing, + the view.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pyarrow.parquet as pq

from bench.scale import event_log, micro_batches
from infra.broker import scratch_broker
from ingest.producer import EventProducer
from ingest.traffic import Record, TrafficConfig, TrafficGenerator
from lake.settings import LakeSettings
from lake.speed_status import read_status, speed_status_path
from runtime.kafka_settings import KafkaSettings
from runtime.topics import ensure_topics

RESULTS = Path("bench/results")
CTR = str(Path(sys.executable).with_name("ctr"))
LIVE_RATE = 2_000
LIVE_SECONDS = 20.0
MAIN_RATE = 5_000
MAIN_SECONDS = 60.0
STEP_RATES = (10_000, 20_000, 30_000, 40_000)
STEP_SECONDS = 20.0
PROBE_EVERY_S = 0.25
POLL_EVERY_S = 0.1
VIEW_RECORDS = 2_000  # the in-process breakdown of the view's Spark job
BACKLOG_EVENTS = 1_000_000  # after a stop: the backlog the restarted job drains
RESTART_BUCKETS_S = 60  # the buckets of the last minute before the stop, for attribution
_PHASES_LINE = re.compile(r"batch (\d+) phases \(ms\): (\{.*\})")


@dataclass
class Phase:
    rate: int
    seconds: float
    probes: dict[str, float] = field(default_factory=dict)  # ad_id -> sent at (epoch s)
    produced: int = 0
    behind: list[tuple[float, int]] = field(default_factory=list)  # (elapsed s, offsets)
    batches: tuple[int, int] = (0, -1)  # first and last micro-batch id of the phase

    @property
    def achieved_rate(self) -> float:
        return self.produced / self.seconds


class ApiWatcher(threading.Thread):
    """Polls the API for the probes' rows: ad_id -> when it was first served (epoch s)."""

    def __init__(self, base_url: str, token: str, since_ms: int) -> None:
        super().__init__(name="api-watcher", daemon=True)
        self.base_url, self.token, self.since_ms = base_url, token, since_ms
        self.seen: dict[str, float] = {}
        # Every answered request: (sent at, answered at, speed/ctr version it read), epoch s.
        self.requests: list[tuple[float, float, int]] = []
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.since_ms / 1000 - 60))
        end = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.since_ms / 1000 + 86_400))
        params = {"campaign_id": "probe", "group_by": "ad_id", "granularity": "all",
                  "start": start, "end": end, "limit": "100000"}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=10) as client:
            while not self._halt.is_set():
                try:
                    sent = time.time()
                    response = client.get("/api/v1/ctr", params=params)
                    now = time.time()
                    response.raise_for_status()
                    body = response.json()
                    for row in body["rows"]:
                        self.seen.setdefault(row["ad_id"], now)
                    version = body["freshness"]["versions"].get("speed/ctr")
                    self.requests.append((sent, now, -1 if version is None else int(version)))
                except (httpx.HTTPError, ValueError, KeyError):
                    self.errors += 1
                self._halt.wait(POLL_EVERY_S)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():  # never started when the job or the API did not come up
            self.join(timeout=15)


def main(events: int | None = None) -> dict[str, object]:
    del events  # rate and duration define this benchmark
    with tempfile.TemporaryDirectory(prefix="ctr-bench-speed-") as scratch:
        work = Path(scratch)
        kafka = KafkaSettings()
        if not kafka.is_loopback:
            return _run(kafka, work)
        with scratch_broker(work / "run", topic="bench-speed") as local:
            return _run(local, work)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(kafka: KafkaSettings, work: Path) -> dict[str, object]:
    ensure_topics(kafka)
    lake = LakeSettings(lake_root=work / "lake", checkpoint_root=work / "checkpoints")
    token, port = secrets.token_urlsafe(24), _free_port()
    env = {
        **os.environ,
        **kafka.environ(),  # the cluster and its credentials, if it requires a login
        "KAFKA_TOPIC": kafka.topic,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "SPEED_MAINTENANCE_SECONDS": "3600",  # keep every file for the post-run scan
        "API_TOKEN": token,
    }
    log = (work / "speed.log").open("w")
    api_log = (work / "api.log").open("w")
    job = subprocess.Popen([CTR, "speed"], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)  # fmt: skip
    api = subprocess.Popen([CTR, "serve", "--port", str(port)], env=env, stdout=api_log,
                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    watcher = ApiWatcher(f"http://127.0.0.1:{port}", token, int(time.time() * 1000))
    try:
        generator = TrafficGenerator(
            TrafficConfig(seed=11, start_ms=int(time.time() * 1000), events_per_second=MAIN_RATE)
        )
        with EventProducer(kafka) as producer:
            print("bench speed: warming up (job start + 15 s of traffic) ...", flush=True)
            warmup = Phase(MAIN_RATE, 15.0)
            _wait_for_status(lake, job, producer, generator)
            _wait_for_api(port, api)
            watcher.start()
            _produce_phase(warmup, producer, generator, lake, "warmup")
            _drain(lake, job)
            phases = [Phase(LIVE_RATE, LIVE_SECONDS), Phase(MAIN_RATE, MAIN_SECONDS)]
            phases += [Phase(rate, STEP_SECONDS) for rate in STEP_RATES]
            for number, phase in enumerate(phases):
                print(f"bench speed: {phase.rate:,} events/s for {phase.seconds:.0f} s ...",
                      flush=True)  # fmt: skip
                first = _status_batch(lake) + 1
                RECORDER.on = number == len(phases) - 1  # the last minutes before the stop
                _produce_phase(phase, producer, generator, lake, f"p{number}")
                _drain(lake, job)
                time.sleep(1.0)  # the API's snapshot refresh
                phase.batches = (first, _status_batch(lake))
            visible = _visibility(lake.table("speed/ctr"))
            watcher.stop()
            _stop(job)
            stopped_ms = RECORDER.last_ms
            # The backlog: produced while the job is down, then drained by a restarted job
            # (whose event log counts the bytes its tasks return to the driver).
            print(f"bench speed: job stopped; producing a backlog of {BACKLOG_EVENTS:,} events "
                  "...", flush=True)  # fmt: skip
            for _ in range(BACKLOG_EVENTS // 10_000):
                _send(producer, generator, 10_000)
                producer.poll(0)
            producer.flush()
        job = _restart(env, work)
        _drain(lake, job, timeout_s=900, settle_s=30)
        backlog = _backlog_figures(work / "speed-backlog.log", work / "spark-events")
        backlog["restart"] = _restart_attribution(lake, stopped_ms)
    finally:
        watcher.stop()
        for process in (job, api):
            _stop(process)
        log.close()
        api_log.close()
    files = _table_files(lake.table("speed/ctr"))
    breakdown = _view_breakdown(kafka, work)
    return _report(phases, visible, watcher, work, files, breakdown, backlog)


def _restart(env: dict[str, str], work: Path) -> subprocess.Popen[bytes]:
    """The job again, its Spark event log under ``work/spark-events``."""
    print("bench speed: restarting the job on the backlog ...", flush=True)
    events_log = work / "spark-events"
    events_log.mkdir()
    spark_conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events_log),
                  "spark.eventLog.compress": "false",
                  "spark.eventLog.rolling.enabled": "false"}  # fmt: skip
    log = (work / "speed-backlog.log").open("w")
    return subprocess.Popen([CTR, "speed"], env={**env, "SPARK_CONF": json.dumps(spark_conf)},
                            stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)


def _backlog_figures(log: Path, events_log: Path) -> dict[str, object]:
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


def _restart_attribution(lake: LakeSettings, stopped_ms: int) -> dict[str, object]:
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


def _wait_for_api(port: int, api: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and api.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("ctr serve did not start (see its log)")


def _status_batch(lake: LakeSettings) -> int:
    status = read_status(lake)
    return int(status.batch_id or 0) if status else 0


def _wait_for_status(
    lake: LakeSettings, job: subprocess.Popen[bytes], producer: EventProducer,
    generator: TrafficGenerator,
) -> None:  # fmt: skip
    status = speed_status_path(lake)
    deadline = time.monotonic() + 120
    while not status.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("ctr speed did not start (see its log)")
        _send(producer, generator, 100)
        time.sleep(0.5)


class Recorder:
    """The events sent while it records: the first impression of each id (event time, minute,
    ad) and every click (impression id, event time), for the exact attribution."""

    def __init__(self) -> None:
        self.on = False
        self.impressions: dict[str, tuple[int, int]] = {}  # id -> (event ms, bucket ms)
        self.clicks: list[tuple[str, int]] = []
        self.last_ms = 0  # the newest event time recorded

    def add(self, records: list[Record]) -> None:
        for r in records:
            event = r.event
            if r.kind != "event" or event is None:
                continue
            self.last_ms = max(self.last_ms, event.event_time)
            if event.event_type == "impression":
                bucket = event.event_time // 60_000 * 60_000
                self.impressions.setdefault(event.impression_id, (event.event_time, bucket))
            elif event.event_type == "click":
                self.clicks.append((event.impression_id, event.event_time))

    def attributed(self, start_ms: int, end_ms: int, window_ms: int) -> dict[int, int]:
        """Bucket -> attributed clicks (the batch layer's rule: the first click within the
        window after the impression), for the impressions of buckets in [start, end)."""
        clicked: set[str] = set()
        per_bucket: dict[int, int] = {}
        for impression, click_ms in sorted(self.clicks, key=lambda c: c[1]):
            seen = self.impressions.get(impression)
            if seen is None or impression in clicked or not 0 <= click_ms - seen[0] <= window_ms:
                continue
            clicked.add(impression)
            if start_ms <= seen[1] < end_ms:
                per_bucket[seen[1]] = per_bucket.get(seen[1], 0) + 1
        return per_bucket


RECORDER = Recorder()


def _send(producer: EventProducer, generator: TrafficGenerator, n: int) -> int:
    records = [next(generator) for _ in range(n)]
    if RECORDER.on:
        RECORDER.add(records)
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
    status = read_status(lake)
    return status.offsets_behind if status else None


def _drain(
    lake: LakeSettings, job: subprocess.Popen[bytes], timeout_s: float = 120, settle_s: float = 2
) -> None:
    """Let the job catch up before the next phase (so phases do not blur)."""
    deadline = time.monotonic() + timeout_s
    time.sleep(settle_s)
    while time.monotonic() < deadline and job.poll() is None:
        if _offsets_behind(lake) == 0:
            return
        time.sleep(0.5)


def _visibility(table: str) -> dict[str, tuple[float, int]]:
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


def _api_share(
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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _latency_figures(latencies: list[float]) -> dict[str, float | None]:
    if not latencies:
        return {"p50_s": None, "p95_s": None, "max_s": None}
    return {
        "p50_s": round(statistics.median(latencies), 3),
        "p95_s": round(_percentile(latencies, 0.95), 3),
        "max_s": round(max(latencies), 3),
    }


def _report(  # noqa: PLR0917
    phases: list[Phase],
    visible: dict[str, tuple[float, int]],
    watcher: ApiWatcher,
    work: Path,
    files: dict[str, int],
    view_breakdown: dict[str, float],
    backlog: dict[str, object],
) -> dict[str, object]:
    batch_phases = _batch_phases(work / "speed.log")
    rows = []
    for phase in phases:
        committed = [visible[ad][0] - sent for ad, sent in phase.probes.items() if ad in visible]
        served = [watcher.seen[ad] - sent for ad, sent in phase.probes.items()
                  if ad in watcher.seen]  # fmt: skip
        missing = len(phase.probes) - len(committed)
        behind = [b for _, b in phase.behind]
        third = max(1, len(behind) // 3)
        # Keeping up: the backlog at the end of the phase is no bigger than at its start
        # (plus two seconds of input) and never above ~3 s of input.
        bounded = bool(behind) and max(behind) <= 3 * phase.rate
        flat = bool(behind) and max(behind[-third:]) <= max(behind[:third]) + 2 * phase.rate
        first, last = phase.batches
        in_phase = [p for batch, p in batch_phases.items()
                    if first <= batch <= last and p.get("view_rows", 0) > 0]  # fmt: skip
        rows.append(
            {
                "rate": phase.rate,
                "achieved_rate": round(phase.achieved_rate),
                "seconds": phase.seconds,
                "probes": len(phase.probes),
                "missing": missing,
                **_latency_figures(committed),
                "api": {**_latency_figures(served), "missing": len(phase.probes) - len(served)},
                "max_offsets_behind": max(behind) if behind else None,
                "kept_up": bounded and flat and missing == 0,
                "api_share_ms": _api_share(phase, visible, watcher.requests),
                "batches": len(in_phase),
                "batch_phases_ms": _medians(in_phase),
            }
        )
    live_row, main_row = rows[0], rows[1]
    sustained = max((int(str(r["achieved_rate"])) for r in rows if r["kept_up"]), default=0)
    api_main = main_row["api"]
    assert isinstance(api_main, dict)
    live_phases = live_row["batch_phases_ms"]
    assert isinstance(live_phases, dict)
    result: dict[str, object] = {
        "benchmark": "speed",
        "goal": "API freshness p95 <= 2 s at 5,000 events/s; a 2,000-record micro-batch "
        "<= 1 s; the backlog drained at >= 80,000 events/s with <= 100 KB to the driver per "
        "million events; after a restart, attributed clicks within 2 % of the exact count",
        "p50_s": main_row["p50_s"],
        "p95_s": main_row["p95_s"],
        "max_s": main_row["max_s"],
        "api_p50_s": api_main["p50_s"],
        "api_p95_s": api_main["p95_s"],
        "api_max_s": api_main["max_s"],
        "api_poll_errors": watcher.errors,
        "live_batch_ms_median": live_phases.get("spark.triggerExecution"),
        "highest_sustained_rate": sustained,
        "backlog": backlog,
        "phases": rows,
        "speed_ctr_files": files,
        "view_breakdown_ms": view_breakdown,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, local[2]",
    }
    print(
        f"bench speed: {MAIN_RATE:,} events/s for {MAIN_SECONDS:.0f} s: through the API "
        f"p50 {api_main['p50_s']} s, p95 {api_main['p95_s']} s, max {api_main['max_s']} s "
        f"(goal p95 <= 2 s); committed p50 {main_row['p50_s']} s, p95 {main_row['p95_s']} s"
    )
    for r in rows:
        api = r["api"]
        assert isinstance(api, dict)
        print(f"  {r['rate']:>6,}/s (achieved {r['achieved_rate']:,}/s): API p50 {api['p50_s']} s, "
              f"p95 {api['p95_s']} s, max {api['max_s']} s; committed p50 {r['p50_s']} s, "
              f"p95 {r['p95_s']} s; max behind {r['max_offsets_behind']}, "
              f"missing {r['missing']}, kept up: {r['kept_up']}")  # fmt: skip
    print(
        f"bench speed: highest rate sustained without growing lag: {sustained:,} events/s "
        "(goal >= 20,000)"
    )
    print(
        "bench speed: where a micro-batch's time goes (median ms per batch; spark.* are "
        "Spark's trigger phases, addBatch holds the callback's):"
    )
    names = sorted({n for r in rows for n in r["batch_phases_ms"]},  # type: ignore[union-attr]
                   key=_phase_order)  # fmt: skip
    print("  " + f"{'phase':<24}" + "".join(f"{r['rate']:>9,}/s" for r in rows))
    for name in names:
        cells = "".join(
            f"{r['batch_phases_ms'].get(name, float('nan')):>11,.0f}"  # type: ignore[union-attr]
            for r in rows
        )
        print(f"  {name:<24}{cells}")
    print("bench speed: after the commit, through the API (median ms: snapshot = commit until a "
          "request reading its version is sent; query = that request):")  # fmt: skip
    for name in ("snapshot", "query", "request"):
        cells = "".join(f"{r['api_share_ms'][name]:>11,.0f}" for r in rows)  # type: ignore[index]
        print(f"  {'api.' + name:<24}{cells}")
    print(
        f"bench speed: a live-sized micro-batch (~{LIVE_RATE:,} records): median "
        f"{result['live_batch_ms_median']} ms (goal <= 1,000 ms)"
    )
    print(
        f"bench speed: {VIEW_RECORDS:,} records in-process (median ms; the view's Spark job, "
        "then its rows written each way):"
        + "".join(f" {k} {v:,.0f};" for k, v in view_breakdown.items())
    )
    restart = backlog["restart"]
    assert isinstance(restart, dict)
    print(
        f"bench speed: a backlog of {backlog['events']:,} events after a restart, drained in "
        f"{backlog['batches']} micro-batches at {backlog['rate']:,} events/s (goal >= 80,000); "
        f"{backlog['result_bytes']:,} bytes returned to the driver, "
        f"{backlog['result_bytes_per_million']:,} per million events (goal <= 100 KB)"
    )
    print(
        f"bench speed: attributed clicks of the last {RESTART_BUCKETS_S} s of impressions before "
        f"the restart ({restart['buckets']} buckets): speed {restart['speed']:,}, exact "
        f"{restart['exact']:,}, error {restart['error']} (goal <= 0.02)"
    )
    print(f"bench speed: speed/ctr after the run: {files}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


_ORDER = (
    *("spark.latestOffset", "spark.queryPlanning", "spark.walCommit", "spark.getBatch"),
    *(
        "spark.addBatch",
        "plan",
        "tasks",
        "task.view",
        "task.attribution",
        "task.merge",
        "task.write",
        "late_commit",
        "ctr_commit",
        "view",
        "events",
        "split",
        "attribution",
        "late_write",
        "ctr_write",
        "rollup",
        "state_expiry",
        "maintenance",
    ),
    *("spark.commitOffsets", "spark.triggerExecution", "lag", "status", "view_rows"),
)


def _phase_order(name: str) -> tuple[int, str]:
    return (_ORDER.index(name) if name in _ORDER else len(_ORDER) - 1, name)


def _medians(batches: list[dict[str, int]]) -> dict[str, float]:
    names = {n for b in batches for n in b}
    return {n: statistics.median(b.get(n, 0) for b in batches) for n in sorted(names)}


def _batch_phases(log: Path) -> dict[int, dict[str, int]]:
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


def _table_files(table: str) -> dict[str, int]:
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


def _view_breakdown(kafka: KafkaSettings, work: Path) -> dict[str, float]:
    """The view's Spark job on VIEW_RECORDS records of the topic, taken apart: the Kafka read
    alone, + parsing and validation, + the view (as a Spark aggregation to Arrow, and as the
    job computes it: the events to Arrow, the view on the driver, with reach's sketches; and the
    view on the driver alone, with and without them); then the view's rows written to a
    scratch speed table both ways measured: a delta-spark append with txnAppId/txnVersion (the
    cheapest delta-spark commit) and the job's delta-rs append. Median of 5 rounds, ms."""
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from events.records import parse_records
    from lake.catalog import SPEED_CTR
    from runtime.connectors import read_kafka
    from runtime.offsets import topic_offsets
    from runtime.spark import spark_session
    from speed_layer.attribution import INCREMENTS_SCHEMA
    from speed_layer.tables import SpeedTable
    from speed_layer.tasks import with_attribution
    from views.columns import DIMENSIONS
    from views.ctr import ctr, ctr_arrow

    spark = spark_session()
    parts = topic_offsets(kafka, kafka.topic)
    each = max(1, VIEW_RECORDS // len(parts))
    starting = {kafka.topic: {str(p.partition): p.earliest for p in parts}}
    ending = {kafka.topic: {str(p.partition): min(p.latest, p.earliest + each) for p in parts}}

    def raw() -> DataFrame:  # a new plan per run: Spark would skip a stage it has run before
        return read_kafka(spark, kafka, stream=False, startingOffsets=json.dumps(starting),
                          endingOffsets=json.dumps(ending))  # fmt: skip

    def valid() -> DataFrame:
        return parse_records(raw()).where(F.col("reason").isNull())

    def spark_view() -> pa.Table:  # the view as a Spark aggregation (the job's, before)
        return valid().select("event_time", "event_type", *DIMENSIONS).transform(ctr).toArrow()

    def view() -> pa.Table:  # the job's: the events to the driver, the view of them there
        return ctr_arrow(valid().toArrow(), reach=True)

    # The view on the driver alone, with and without reach's sketches (the job's since reach).
    events = valid().toArrow()
    rows = with_attribution(view(), INCREMENTS_SCHEMA.empty_table())
    rows = rows.append_column(
        "updated_at", pa.array([time.time_ns() // 1000] * rows.num_rows, pa.timestamp("us", "UTC"))
    )
    spark_path, rs_table = (
        str(work / "spark-append"),
        SpeedTable(str(work / "rs-append"), SPEED_CTR.schema, retention_hours=48),
    )
    version = iter(range(1_000))
    steps: dict[str, Callable[[], object]] = {
        "kafka_read": lambda: raw().agg(F.sum(F.length("value"))).collect(),
        "read_and_parse": lambda: valid().agg(F.count(F.lit(1))).collect(),
        "read_parse_spark_view": spark_view,
        "read_parse_view": view,
        "driver_view_without_reach": lambda: ctr_arrow(events),
        "driver_view_with_reach": lambda: ctr_arrow(events, reach=True),
        "delta_spark_append": lambda: (
            spark.createDataFrame(rows)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", "bench")
            .option("txnVersion", str(next(version)))
            .save(spark_path)
        ),
        "delta_rs_append": lambda: rs_table.append(rows, app_id="bench", version=next(version)),
    }
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(6):  # interleaved, the first round a warm-up
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            if round_:
                runs[name].append((time.perf_counter() - started) * 1000)
    timings = {name: round(statistics.median(values), 1) for name, values in runs.items()}
    timings["view_rows"] = rows.num_rows
    return timings
