"""The speed benchmark's traffic: the phases (a rate for a time), the events sent with a probe
every PROBE_EVERY_S, the job's progress from its status file (starting, draining between
phases), and the recorder of the events sent before the stop, for the exact attribution.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ingest.producer import EventProducer
from ingest.traffic import Record, TrafficGenerator
from lake.settings import LakeSettings
from lake.speed_status import read_status, speed_status_path

LIVE_RATE = 2_000
LIVE_SECONDS = 20.0
MAIN_RATE = 5_000
MAIN_SECONDS = 60.0
STEP_RATES = (10_000, 20_000, 30_000, 40_000)
STEP_SECONDS = 20.0
PROBE_EVERY_S = 0.25


@dataclass
class Phase:
    """A rate for a time: the probes and events sent, and the job's backlog meanwhile."""

    rate: int
    seconds: float
    probes: dict[str, float] = field(default_factory=dict)  # ad_id -> sent at (epoch s)
    produced: int = 0
    behind: list[tuple[float, int]] = field(default_factory=list)  # (elapsed s, offsets)
    batches: tuple[int, int] = (0, -1)  # first and last micro-batch id of the phase

    @property
    def achieved_rate(self) -> float:
        return self.produced / self.seconds


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


RECORDER = Recorder()  # on for the last phase before the stop (bench.speed sets it)


def send(producer: EventProducer, generator: TrafficGenerator, n: int) -> int:
    records = [next(generator) for _ in range(n)]
    if RECORDER.on:
        RECORDER.add(records)
    return producer.send_many((r.value, r.key) for r in records)


def produce_phase(
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
        phase.produced += send(producer, generator, per_tick)
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


def drain(
    lake: LakeSettings, job: subprocess.Popen[bytes], timeout_s: float = 120, settle_s: float = 2
) -> None:
    """Let the job catch up before the next phase (so phases do not blur)."""
    deadline = time.monotonic() + timeout_s
    time.sleep(settle_s)
    while time.monotonic() < deadline and job.poll() is None:
        if _offsets_behind(lake) == 0:
            return
        time.sleep(0.5)


def status_batch(lake: LakeSettings) -> int:
    status = read_status(lake)
    return int(status.batch_id or 0) if status else 0


def wait_for_status(
    lake: LakeSettings, job: subprocess.Popen[bytes], producer: EventProducer,
    generator: TrafficGenerator,
) -> None:  # fmt: skip
    status = Path(speed_status_path(lake))  # the benchmark's lake is local
    deadline = time.monotonic() + 120
    while not status.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("ctr speed did not start (see its log)")
        send(producer, generator, 100)
        time.sleep(0.5)
