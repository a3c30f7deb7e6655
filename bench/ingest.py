"""Ingest benchmark: the project's producer against `kcat -P`, same payloads, same broker.

Both send N pre-generated events (JSON, keyed by impression id) with the same settings
(idempotence, acks=all, lz4, linger 20 ms, 1 MiB batches, murmur2 partitioner) into fresh
6-partition topics, alternating, twice each; the best run of each is compared. The project's
time includes validating every record. kcat runs on the librdkafka bundled with
confluent-kafka (Debian's kcat links librdkafka 2.0, which cannot talk to Tansu 0.6), so both
sides use the same client library.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import confluent_kafka

from infra.broker import scratch_broker
from infra.kafka_settings import KafkaSettings
from infra.offsets import partition_offsets
from infra.topics import create_topics, delete_topics
from ingest.producer import EventProducer, ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator

DEFAULT_EVENTS = 1_000_000
ROUNDS = 2
RESULTS = Path("bench/results")


def main(events: int | None = None) -> dict[str, object]:
    events = events or DEFAULT_EVENTS
    kcat = shutil.which("kcat")
    if kcat is None:
        raise SystemExit("bench ingest: kcat is not installed (Debian package kcat)")
    with tempfile.TemporaryDirectory(prefix="ctr-bench-") as scratch:
        return _run(KafkaSettings(), kcat, Path(scratch), events)


@contextmanager
def _fresh_topic(kafka: KafkaSettings, work: Path, prefix: str) -> Iterator[KafkaSettings]:
    """A new 6-partition topic; on a local setup, on a broker of its own, started for this run
    and stopped after it, so every run starts from the same empty in-memory log."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    if kafka.is_loopback:
        with scratch_broker(work / "run", topic=topic) as local:
            create_topics(local, {topic: 6})
            yield local
        return
    create_topics(kafka, {topic: 6})
    try:
        yield kafka.model_copy(update={"topic": topic})
    finally:
        delete_topics(kafka, [topic])


def _run(kafka: KafkaSettings, kcat: str, work: Path, events: int) -> dict[str, object]:
    print(f"bench ingest: generating {events:,} events ...", flush=True)
    start_ms = int(time.time() * 1000) - events  # 1000 events/s of event time, ending now
    generator = TrafficGenerator(TrafficConfig(seed=42, start_ms=start_ms))
    payloads = [(r.value, r.key or b"") for r in (next(generator) for _ in range(events))]
    lines = work / "payloads.tsv"
    with lines.open("wb") as handle:
        for value, key in payloads:
            handle.write(key + b"\t" + value + b"\n")
    size_mb = sum(len(v) for v, _ in payloads) / 1e6
    print(f"bench ingest: {size_mb:,.0f} MB of values, avg {size_mb * 1e6 / events:.0f} B")

    env = {"LD_LIBRARY_PATH": str(_bundled_librdkafka(work))}
    settings = ProducerSettings()
    project: list[float] = []
    reference: list[float] = []
    for round_ in range(1, ROUNDS + 1):
        with _fresh_topic(kafka, work, "bench-kcat") as target:
            seconds = _time_kcat(kcat, target, lines, settings, env)
            _check_count(target, events)
        reference.append(events / seconds)
        print(f"  round {round_}: kcat -P   {events / seconds:>10,.0f} events/s")

        with _fresh_topic(kafka, work, "bench-project") as target:
            seconds = _time_project(target, payloads, settings)
            _check_count(target, events)
        project.append(events / seconds)
        print(f"  round {round_}: project   {events / seconds:>10,.0f} events/s")

    best_project, best_kcat = max(project), max(reference)
    result = {
        "benchmark": "ingest",
        "events": events,
        "project_events_per_s": round(best_project),
        "kcat_events_per_s": round(best_kcat),
        "ratio": round(best_project / best_kcat, 3),
        "goal": ">= 0.7",
        "runs": {"project": [round(r) for r in project], "kcat": [round(r) for r in reference]},
        "machine": _machine(),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    print(
        f"bench ingest: project {best_project:,.0f} events/s, kcat {best_kcat:,.0f} events/s, "
        f"ratio {best_project / best_kcat:.2f} (goal >= 0.7)"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _time_project(
    kafka: KafkaSettings, payloads: Sequence[tuple[bytes, bytes | None]], settings: ProducerSettings
) -> float:
    producer = EventProducer(kafka, settings)
    started = time.perf_counter()
    producer.send_many(payloads)
    remaining = producer.flush()
    seconds = time.perf_counter() - started
    if remaining or producer.stats.lost or producer.stats.dead_lettered:
        raise RuntimeError(f"project producer lost records: {producer.stats}")
    return seconds


def _time_kcat(
    kcat: str,
    kafka: KafkaSettings,
    lines: Path,
    settings: ProducerSettings,
    env: dict[str, str],
) -> float:
    options = {**settings.client_overrides(), "delivery.report.only.error": None}
    command = [kcat, "-P", "-b", kafka.bootstrap_servers, "-t", kafka.topic, "-K", "\t", "-l"]
    for name, value in options.items():
        if value is not None:
            command += ["-X", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    command.append(str(lines))
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return time.perf_counter() - started


def _check_count(kafka: KafkaSettings, expected: int) -> None:
    offsets = partition_offsets(kafka, [(kafka.topic, p) for p in range(6)])
    got = sum(o.records for o in offsets)
    if got != expected:
        raise RuntimeError(f"{kafka.topic}: expected {expected:,} records, found {got:,}")


def _bundled_librdkafka(work: Path) -> Path:
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    [library] = sorted(libs.glob("librdkafka-*.so.1"))
    target = work / "lib"
    target.mkdir(exist_ok=True)
    (target / "librdkafka.so.1").symlink_to(library)
    return target


def _machine() -> str:
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
