"""Ingest benchmark on Apache Kafka: the project's producer against `kcat -P`, same payloads,
same broker; then the same on a 3-broker cluster (acks=all, min.insync.replicas=2), and the
time from a partition leader's SIGKILL until sends succeed again.

Both producers send N pre-generated events (JSON, keyed by impression id) with the same
settings (idempotence, acks=all, lz4, linger 20 ms, 1 MiB batches, murmur2 partitioner) into
fresh 6-partition topics, after one untimed warm-up send, in ROUNDS interleaved rounds (each
round both, the first alternating): the figure is the median of the rounds' ratios (each
round's pair ran back to back, so a slow minute of the machine hits both), with the median
rate of each. The project's time includes validating every record. kcat is Debian's (its own
librdkafka). Each round also records CPU seconds: the sender's process (Python and librdkafka's
threads; kcat's, as a child process) and the brokers' JVMs, which share the machine's cores.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka

from infra.broker import LocalKafka, scratch_cluster
from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from runtime.kafka_settings import KafkaSettings
from runtime.offsets import partition_offsets
from runtime.topics import admin_client, delete_topics, ensure_topics

DEFAULT_EVENTS = 1_000_000
ROUNDS = 3
FAILOVERS = 3
RESULTS = Path("bench/results")
KAFKA_VERSION = "4.1.1"


def main(events: int | None = None) -> dict[str, object]:
    events = events or DEFAULT_EVENTS
    kcat = shutil.which("kcat")
    if kcat is None:
        raise SystemExit("bench ingest: kcat is not installed (Debian package kcat)")
    with tempfile.TemporaryDirectory(prefix="ctr-bench-") as scratch:
        return _run(kcat, Path(scratch), events)


def _run(kcat: str, work: Path, events: int) -> dict[str, object]:
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

    with scratch_cluster(work / "one", brokers=1) as (kafka, cluster):
        one = _compare(kcat, kafka, cluster, lines, payloads, label="1 broker")
    with scratch_cluster(work / "three", brokers=3) as (kafka, cluster):
        three = _compare(kcat, kafka, cluster, lines, payloads, label="3 brokers")
        failover = [_failover(kafka, cluster) for _ in range(FAILOVERS)]
    print(
        f"bench ingest: failover after a leader's SIGKILL: "
        f"{', '.join(f'{s:.2f} s' for s in failover)}"
    )
    result = {
        "benchmark": "ingest",
        "events": events,
        **one,
        "goal": ">= 0.7",
        "three_brokers": three,
        "failover_s": [round(s, 2) for s in failover],
        "kafka": f"Apache Kafka {KAFKA_VERSION} (KRaft)",
        "machine": _machine(),
        "librdkafka": confluent_kafka.libversion()[0],
        "kcat": _kcat_version(kcat),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _compare(
    kcat: str,
    kafka: KafkaSettings,
    cluster: LocalKafka,
    lines: Path,
    payloads: Sequence[tuple[bytes, bytes]],
    *,
    label: str,
) -> dict[str, Any]:
    events = len(payloads)
    settings = ProducerSettings()
    project: list[float] = []
    reference: list[float] = []
    # CPU seconds per round: the sender's process (its Python and librdkafka's threads), and
    # the brokers' JVMs. The machine's cores are shared by both, so the rates follow the sum.
    cpu: dict[str, list[tuple[float, float]]] = {"project": [], "kcat": []}
    # A broker's first million records run slower (its JIT warms up): one untimed send first.
    with _fresh_topic(kafka, "bench-warm") as target:
        _time_kcat(kcat, target, lines, settings)
    for round_ in range(1, ROUNDS + 1):
        # Alternate who goes first, so neither always meets the broker just after the other.
        order = ("kcat", "project") if round_ % 2 else ("project", "kcat")
        for who in order:
            with _fresh_topic(kafka, f"bench-{who}") as target:
                before = _cpu_seconds(cluster)
                if who == "kcat":
                    seconds = _time_kcat(kcat, target, lines, settings)
                else:
                    seconds = _time_project(target, payloads, settings)
                after = _cpu_seconds(cluster)
                _check_count(target, events)
            (reference if who == "kcat" else project).append(events / seconds)
            sender = after["children" if who == "kcat" else "self"]
            sender -= before["children" if who == "kcat" else "self"]
            brokers = after["brokers"] - before["brokers"]
            cpu[who].append((sender, brokers))
            print(
                f"  {label}, round {round_}: {who:<8} {events / seconds:>10,.0f} events/s; CPU "
                f"{sender:.2f} s sender, {brokers:.2f} s broker(s)"
            )
    ratios = [p / k for p, k in zip(project, reference, strict=True)]
    ratio = statistics.median(ratios)
    median_project, median_kcat = statistics.median(project), statistics.median(reference)
    print(
        f"bench ingest ({label}): project {median_project:,.0f} events/s, kcat "
        f"{median_kcat:,.0f} events/s (medians of {ROUNDS} interleaved rounds); ratio "
        f"{ratio:.2f} (median of the rounds' {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    cpu_per_million = {
        who: {
            "sender_s": round(statistics.median(c[0] for c in runs) * 1e6 / events, 2),
            "brokers_s": round(statistics.median(c[1] for c in runs) * 1e6 / events, 2),
        }
        for who, runs in cpu.items()
    }
    print(
        f"bench ingest ({label}): CPU seconds per million events (medians): "
        + "; ".join(
            f"{who} {c['sender_s']:.2f} sender + {c['brokers_s']:.2f} broker(s)"
            for who, c in cpu_per_million.items()
        )
    )
    return {
        "cpu_per_million_s": cpu_per_million,
        "project_events_per_s": round(median_project),
        "kcat_events_per_s": round(median_kcat),
        "ratio": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "runs": {"project": [round(r) for r in project], "kcat": [round(r) for r in reference]},
    }


@contextmanager
def _fresh_topic(kafka: KafkaSettings, prefix: str) -> Iterator[KafkaSettings]:
    """A new 6-partition topic, replicated as the cluster's size says, deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    topic = kafka.model_copy(update={"topic": name, "dlq_topic": f"{name}-dlq"})
    ensure_topics(topic)
    try:
        yield topic
    finally:
        delete_topics(kafka, [name, f"{name}-dlq"])


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


def _time_kcat(kcat: str, kafka: KafkaSettings, lines: Path, settings: ProducerSettings) -> float:
    options = {**settings.client_overrides(), "delivery.report.only.error": None}
    command = [kcat, "-P", "-b", kafka.bootstrap_servers, "-t", kafka.topic, "-K", "\t", "-l"]
    security = kafka.security_config()
    if security:  # a secured cluster: its login in a file of kcat's (-F), owner-only
        properties = lines.with_name("kcat.properties")
        descriptor = os.open(properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.writelines(f"{name}={value}\n" for name, value in security.items())
        command[1:1] = ["-F", str(properties)]
    environment = _kcat_environment(kcat, security, lines.parent)
    for name, value in options.items():
        if value is not None:
            command += ["-X", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    command.append(str(lines))
    started = time.perf_counter()
    subprocess.run(command, check=True, env=environment)
    return time.perf_counter() - started


def _kcat_environment(kcat: str, security: dict[str, Any], work: Path) -> dict[str, str] | None:
    """kcat's environment: for a SCRAM login, librdkafka 2.6.1 or newer. Older ones (Debian
    12's kcat links 2.0.2) repeat the client nonce in their final SCRAM message, which Kafka 4
    refuses as invalid credentials (confluentinc/librdkafka#4895): kcat then runs on the
    librdkafka of the confluent-kafka wheel (LD_LIBRARY_PATH)."""
    if not str(security.get("sasl.mechanism", "")).upper().startswith("SCRAM"):
        return None
    version = subprocess.run([kcat, "-V"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", version)
    if match is None or tuple(map(int, match.groups())) >= (2, 6, 1):
        return None
    libraries = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    bundled = sorted(libraries.glob("librdkafka*.so*"))
    if not bundled:
        raise SystemExit(
            f"bench ingest: {kcat} links a librdkafka older than 2.6.1, which cannot log in "
            "to Kafka 4 with SCRAM, and the confluent-kafka wheel has none to lend it"
        )
    directory = work / "kcat-lib"
    directory.mkdir(exist_ok=True)
    link = directory / "librdkafka.so.1"
    link.unlink(missing_ok=True)
    link.symlink_to(bundled[0])
    return {**os.environ, "LD_LIBRARY_PATH": str(directory)}


def _cpu_seconds(cluster: LocalKafka) -> dict[str, float]:
    """CPU seconds so far of this process (its threads: Python and librdkafka's), of its
    finished children (kcat), and of the cluster's running broker JVMs."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    ticks = os.sysconf("SC_CLK_TCK")
    brokers = 0.0
    for pid in cluster.state().pids.values():
        if pid is None:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # stopped since
        brokers += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return {
        "self": me.ru_utime + me.ru_stime,
        "children": children.ru_utime + children.ru_stime,
        "brokers": brokers,
    }


def _check_count(kafka: KafkaSettings, expected: int) -> None:
    offsets = partition_offsets(kafka, [(kafka.topic, p) for p in range(6)])
    got = sum(o.records for o in offsets)
    if got != expected:
        raise RuntimeError(f"{kafka.topic}: expected {expected:,} records, found {got:,}")


def _failover(kafka: KafkaSettings, cluster: LocalKafka) -> float:
    """Seconds from SIGKILLing the leader of partition 0 until the first record sent after
    the kill is acknowledged (acks=all, idempotent, one record every 2 ms to partition 0)."""
    with _fresh_topic(kafka, "bench-failover") as topic:
        metadata = admin_client(topic).list_topics(topic.topic, timeout=10)
        leader = metadata.topics[topic.topic].partitions[0].leader
        acked: list[tuple[float, float]] = []  # (sent, acknowledged)
        failed: list[str] = []
        settings = ProducerSettings(linger_ms=0)
        producer = confluent_kafka.Producer(
            topic.client(**{**settings.client_overrides(), "delivery.report.only.error": False})
        )
        stop = threading.Event()

        def send() -> None:
            while not stop.is_set():
                sent = time.monotonic()

                def report(error: Any, _message: Any, sent: float = sent) -> None:
                    if error is None:
                        acked.append((sent, time.monotonic()))
                    else:
                        failed.append(str(error))

                producer.produce(topic.topic, value=b"x", partition=0, on_delivery=report)
                producer.poll(0.002)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            time.sleep(1.0)
            killed_at = time.monotonic()
            cluster.kill(leader)
            deadline = killed_at + 60
            while time.monotonic() < deadline and not any(s >= killed_at for s, _ in acked):
                time.sleep(0.01)
        finally:
            stop.set()
            sender.join()
            producer.flush(60)
        cluster.start()  # the killed broker back for the next round
        after = [done for sent, done in acked if sent >= killed_at]
        if not after or failed:
            raise RuntimeError(f"no send succeeded after the failover ({failed[:3]})")
        seconds = min(after) - killed_at
        print(f"  failover: broker {leader} killed, sends acknowledged again after {seconds:.2f} s")
        return seconds


def _kcat_version(kcat: str) -> str:
    done = subprocess.run([kcat, "-V"], capture_output=True, text=True, check=False)
    return " ".join(done.stdout.split()[:6])


def _machine() -> str:
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
