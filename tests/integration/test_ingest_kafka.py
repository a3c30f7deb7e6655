"""Ingest against the real broker: generator -> producer -> Kafka, read back and checked."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from events.model import Event, validate
from infra.broker import free_port
from ingest.ground_truth import GroundTruth, read_csv
from ingest.producer import REASON_HEADER, SOURCE_HEADER, DeliveryStats, EventProducer
from ingest.replay import replay
from ingest.send_loop import ProduceSummary, produce
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from runtime.kafka_settings import KafkaSettings
from runtime.offsets import partition_offsets, topic_offsets
from runtime.topics import ensure_topics
from tests.support.consume import read_topic
from tests.support.waiting import wait_until

START_MS = 1_790_000_000_000  # 2026-09-21T14:13:20Z
CTR = str(Path(sys.executable).with_name("ctr"))


def _generate(
    topics: KafkaSettings, tmp_path: Path, **fractions: Any
) -> tuple[
    ProduceSummary, DeliveryStats, dict[tuple[int, str, str, str, str, str], tuple[int, int]]
]:
    config = dataclasses.replace(TrafficConfig(seed=7, start_ms=START_MS), **fractions)
    truth = GroundTruth()
    with EventProducer(
        topics, ProducerSettings(), clock=lambda: START_MS / 1000 + 3600
    ) as producer:
        summary = produce(TrafficGenerator(config), producer, limit=20_000, ground_truth=truth)
    truth.write_csv(tmp_path / "truth.csv")
    return summary, producer.stats, read_csv(tmp_path / "truth.csv")


def test_generated_traffic_reads_back_as_configured(topics: KafkaSettings, tmp_path: Path) -> None:
    summary, stats, truth = _generate(
        topics, tmp_path, duplicate_fraction=0.05, late_fraction=0.1, malformed_fraction=0.02
    )
    records = read_topic(topics, topics.topic)
    dead = read_topic(topics, topics.dlq_topic)

    assert summary.records == 20_000
    assert len(records) == summary.events + summary.duplicates == stats.delivered
    assert len(dead) == summary.malformed == stats.dead_letter_delivered
    assert stats.lost == 0
    assert summary.duplicates / 20_000 == pytest.approx(0.05, abs=0.01)
    assert summary.malformed / 20_000 == pytest.approx(0.02, abs=0.006)

    # Every record on the event topic is valid and keyed by its impression id.
    events: list[tuple[int, Event]] = []
    for record in records:
        event = validate(record.value, START_MS + 3_600_000)
        assert isinstance(event, Event), record.value
        assert record.key == event.impression_id.encode()
        events.append((record.partition, event))

    # Resends are exact copies of an earlier event: as many as the generator reported.
    seen: dict[str, Event] = {}
    resent = 0
    for _, event in events:
        if event.event_id in seen:
            assert seen[event.event_id] == event
            resent += 1
        seen[event.event_id] = event
    assert resent == summary.duplicates

    # A click travels in its impression's partition and never precedes it in that partition.
    impressions_at: dict[str, int] = {}
    for index, (_, event) in enumerate(events):
        if event.event_type == "impression":
            impressions_at.setdefault(event.impression_id, index)
    clicks_checked = 0
    for index, (partition, event) in enumerate(events):
        if event.event_type == "click":
            first = impressions_at[event.impression_id]
            assert events[first][0] == partition
            assert first < index
            clicks_checked += 1
    assert clicks_checked > 0

    # Late events: event_time far behind the newest event already seen in their partition.
    newest: dict[int, int] = {}
    late = 0
    unique = {e.event_id: (p, e) for p, e in events}
    for partition, event in unique.values():
        if event.event_time < newest.get(partition, 0) - 120_000:
            late += 1
        newest[partition] = max(newest.get(partition, 0), event.event_time)
    assert late / len(unique) == pytest.approx(0.1, abs=0.02)

    # Dead letters carry the untouched record, the reason and where it came from.
    for record in dead:
        assert record.headers[REASON_HEADER]
        assert record.headers[SOURCE_HEADER] == b"producer"
        assert not isinstance(validate(record.value, START_MS + 3_600_000), Event)

    # The ground truth (written to CSV and read back) is exactly the distinct events that
    # reached the topic.
    consumed = GroundTruth()
    for event in {e.event_id: e for _, e in events}.values():
        consumed.add(event)
    assert truth == {key: (cell[0], cell[1]) for key, cell in consumed.counts.items()}
    assert sum(c for _, c in truth.values()) > 0  # the traffic does click


def test_offsets_are_verified_past_the_reported_high_watermark(topics: KafkaSettings) -> None:
    # Tansu 0.6 reports base offset of the last batch + 1 as "latest"; 5 records in one batch.
    producer = Producer(topics.client(**{"linger.ms": 100}))
    for n in range(5):
        producer.produce(topics.topic, value=b"x%d" % n, partition=0)
    assert producer.flush(10) == 0
    [offsets] = partition_offsets(topics, [(topics.topic, 0)])
    assert (offsets.earliest, offsets.latest) == (0, 5)
    assert len(read_topic(topics, topics.topic)) == 5


def test_topic_offsets_cover_every_partition_and_name_a_missing_topic(
    topics: KafkaSettings,
) -> None:
    producer = Producer(topics.client())
    for partition in (0, 3):
        producer.produce(topics.topic, value=b"x", partition=partition)
    assert producer.flush(10) == 0
    offsets = topic_offsets(topics, topics.topic)
    assert [(o.partition, o.records) for o in offsets] == [
        (p, 1 if p in (0, 3) else 0) for p in range(6)
    ]
    with pytest.raises(LookupError, match="topic no-such-topic not found"):
        topic_offsets(topics, "no-such-topic", timeout_s=5)


def test_ensure_topics_is_idempotent(kafka: KafkaSettings) -> None:
    settings = kafka.model_copy(update={"topic": "idem-a", "dlq_topic": "idem-a-dlq"})
    first = ensure_topics(settings)
    second = ensure_topics(settings)
    assert [(t.name, t.status, t.partitions) for t in first] == [
        ("idem-a", "created", 6),
        ("idem-a-dlq", "created", 1),
    ]
    assert [(t.name, t.status, t.partitions) for t in second] == [
        ("idem-a", "exists", 6),
        ("idem-a-dlq", "exists", 1),
    ]


def test_all_delivery_reports_mode_counts_the_same(topics: KafkaSettings) -> None:
    settings = ProducerSettings(delivery_reports="all")
    with EventProducer(topics, settings) as producer:
        config = TrafficConfig(seed=3, start_ms=int(time.time() * 1000), malformed_fraction=0.1)
        summary = produce(TrafficGenerator(config), producer, limit=2_000)
    assert producer.stats.delivered == summary.events + summary.duplicates
    assert producer.stats.dead_letter_delivered == summary.malformed
    assert len(read_topic(topics, topics.topic)) == producer.stats.delivered


def test_replay_preserves_event_time_and_dead_letters_bad_lines(
    topics: KafkaSettings, tmp_path: Path
) -> None:
    good = [
        TrafficGenerator(TrafficConfig(seed=5, start_ms=START_MS)).__next__().event
        for _ in range(1)
    ]
    event = good[0]
    assert event is not None
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_bytes(
        event.to_json()
        + b"\n\n"
        + b'{"event_id": "broken"\n'
        + orjson.dumps({**orjson.loads(event.to_json()), "event_id": "e2", "country": "XX"})
        + b"\n"
    )
    csv = tmp_path / "events.csv"
    header = ",".join(orjson.loads(event.to_json()))
    row = ",".join(str(v) for v in orjson.loads(event.to_json()).values())
    renamed = row.replace(event.event_id, "csv-1")
    csv.write_text(f"{header}\n{renamed}\n{row.replace(str(event.event_time), 'soon')}\n")

    with EventProducer(topics, ProducerSettings()) as producer:
        first = replay(jsonl, producer)
        second = replay(csv, producer)
    assert (first.lines, first.sent, first.dead_lettered) == (3, 1, 2)
    assert (second.lines, second.sent, second.dead_lettered) == (2, 1, 1)

    sent = sorted((orjson.loads(r.value) for r in read_topic(topics, topics.topic)), key=str)
    assert {s["event_id"] for s in sent} == {event.event_id, "csv-1"}
    assert {s["event_time"] for s in sent} == {event.event_time}
    dead = {r.headers[SOURCE_HEADER].decode(): r for r in read_topic(topics, topics.dlq_topic)}
    assert set(dead) == {"events.jsonl:3", "events.jsonl:4", "events.csv:3"}
    assert dead["events.jsonl:3"].headers[REASON_HEADER].startswith(b"record: not valid JSON")
    assert dead["events.jsonl:4"].headers[REASON_HEADER].startswith(b"country:")
    assert dead["events.csv:3"].headers[REASON_HEADER].startswith(b"event_time:")


def ctr_produce(
    env: dict[str, str], options: list[str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `ctr produce` with ``options`` to its end (its output as text)."""
    return subprocess.run(
        [CTR, "produce", *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_produce_command_writes_ground_truth(kafka_env: dict[str, str], tmp_path: Path) -> None:
    truth = tmp_path / "truth.csv"
    sample = ["--events", "3000", "--seed", "1", "--malformed", "0.05"]
    done = ctr_produce(kafka_env, [*sample, "--ground-truth", str(truth)], timeout_s=120)
    assert done.returncode == 0, done.stderr
    assert "sent 3,000 records" in done.stderr
    assert "0 failed" in done.stderr
    counts = read_csv(truth)
    settings = KafkaSettings.from_environ(kafka_env)
    assert sum(i + c for i, c in counts.values()) == len(read_topic(settings, settings.topic))


def test_produce_fails_fast_when_the_broker_is_unreachable(tmp_path: Path) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    done = ctr_produce(env, ["--events", "10"])
    assert done.returncode != 0
    assert "no Kafka broker answered at 127.0.0.1:" in done.stderr
    assert "Traceback" not in done.stderr


def test_produce_fails_clearly_when_the_topic_is_missing(kafka: KafkaSettings) -> None:
    env = {**os.environ, **kafka.environ(), "KAFKA_TOPIC": "no-such-topic"}
    done = ctr_produce(env, ["--events", "10"])
    assert done.returncode != 0
    assert "no-such-topic" in done.stderr
    assert "ctr kafka create-topics" in done.stderr


def test_sigterm_stops_produce_cleanly_and_loses_nothing(kafka_env: dict[str, str]) -> None:
    settings = KafkaSettings.from_environ(kafka_env)
    with subprocess.Popen(
        [CTR, "produce", "--rate", "2000", "--seed", "2"],
        env=kafka_env,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        coordinates = [(settings.topic, p) for p in range(6)]
        wait_until(
            lambda: sum(o.records for o in partition_offsets(settings, coordinates)) >= 500,
            timeout_s=120,
            what="500 records reached the topic",
            poll_s=0.2,
        )
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "stopped by SIGTERM" in stderr
    sent = int(stderr.split("sent ")[1].split(" records")[0].replace(",", ""))
    assert len(read_topic(settings, settings.topic)) == sent
