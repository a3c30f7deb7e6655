"""The producer's bookkeeping, against a fake client (pure logic; the broker tests are in
test_ingest_kafka.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from events.model import Event
from ingest.producer import REASON_HEADER, EventProducer
from ingest.settings import ProducerSettings
from runtime.kafka_settings import KafkaSettings

NOW_MS = 1_790_000_000_000
KAFKA = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic="events", dlq_topic="dead")


def event(n: int) -> bytes:
    return Event(
        event_id=f"e{n}",
        event_type="impression",
        event_time=NOW_MS,
        impression_id=f"i{n}",
        ad_id="a",
        campaign_id="c",
        site_id="s",
        country="US",
        device_type="mobile",
        user_id="u",
        schema_version=1,
    ).to_json()


class FakeMessage:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


class FakeClient:
    """Queues records; `poll`/`flush` deliver them, failing those whose value is in `fail`."""

    def __init__(self, on_delivery: Callable[[Any, Any], None], *, room: int = 10**9) -> None:
        self.on_delivery = on_delivery
        self.queue: list[tuple[str, bytes, bytes | None, Any]] = []
        self.delivered: list[tuple[str, bytes, bytes | None, Any]] = []
        self.fail: set[bytes] = set()
        self.room = room
        self.stuck = False

    def produce(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, headers: Any = None
    ) -> None:
        if len(self.queue) >= self.room:
            raise BufferError("queue full")
        if value is not None and len(value) > 10_000:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.queue.append((topic, value or b"", key, headers))

    def poll(self, timeout: float = 0) -> int:
        if self.stuck:
            return 0
        served = 0
        for topic, value, key, headers in self.queue:
            if value in self.fail:
                self.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), FakeMessage(topic))
            else:
                self.delivered.append((topic, value, key, headers))
            served += 1
        self.queue.clear()
        return served

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return len(self.queue)


def make(**settings: Any) -> tuple[EventProducer, FakeClient]:
    client = FakeClient(lambda error, message: None, room=settings.pop("room", 10**9))
    producer = EventProducer(
        KAFKA, ProducerSettings(**settings), producer=client, clock=lambda: NOW_MS / 1000
    )
    client.on_delivery = producer._on_delivery
    return producer, client


def test_valid_records_go_to_the_event_topic_keyed_by_impression() -> None:
    producer, client = make()
    assert producer.send(event(1)) is True
    assert producer.send_many([(event(2), None), (event(3), b"explicit")]) == 2
    producer.flush()
    assert [(t, k) for t, _, k, _ in client.delivered] == [
        ("events", b"i1"),
        ("events", b"i2"),
        ("events", b"explicit"),
    ]
    assert (producer.stats.sent, producer.stats.delivered, producer.stats.lost) == (3, 3, 0)


def test_invalid_records_are_dead_lettered_untouched_with_reasons() -> None:
    producer, client = make()
    assert producer.send(b"not json", b"k") is False
    assert producer.send_many([(b'{"event_id": 1}', None)], source="file.jsonl:7") == 0
    producer.flush()
    [(topic, value, key, headers), (_, _, _, headers2)] = client.delivered
    assert (topic, value, key) == ("dead", b"not json", b"k")
    assert dict(headers)[REASON_HEADER].startswith(b"record: not valid JSON")
    assert dict(headers2)["ctr.source"] == b"file.jsonl:7"
    assert (producer.stats.dead_lettered, producer.stats.dead_letter_delivered) == (2, 2)
    assert producer.stats.invalid_reasons["record"] == 1  # not JSON
    assert producer.stats.invalid_reasons["event_id"] == 1  # not a string
    assert producer.stats.invalid_reasons["schema_version (missing)"] == 1


def test_dead_letters_are_counted_by_the_field_they_miss() -> None:
    """`ctr replay` of an event without schema_version said "dead-lettered by field: record 1"
    (issue 70): the missing field is named."""
    producer, _ = make()
    unversioned = orjson.loads(event(1))
    del unversioned["schema_version"]
    no_country = {**orjson.loads(event(2)), "country": "XX"}
    producer.send_many([(orjson.dumps(r), None) for r in (unversioned, no_country)])
    assert dict(producer.stats.invalid_reasons) == {"schema_version (missing)": 1, "country": 1}


def test_failed_deliveries_are_counted_with_their_error() -> None:
    producer, client = make()
    client.fail.add(event(2))
    producer.send_many([(event(n), None) for n in range(1, 4)])
    producer.flush()
    assert (producer.stats.delivered, producer.stats.failed, producer.stats.lost) == (2, 1, 1)
    assert producer.stats.errors == ["events: Local: Message timed out"]


def test_records_left_by_a_timed_out_flush_count_as_lost() -> None:
    producer, client = make()
    client.stuck = True
    producer.send(event(1))
    producer.send(event(2))
    assert producer.flush(0.01) == 2
    assert (producer.stats.undelivered, producer.stats.lost, producer.stats.delivered) == (2, 2, 0)
    assert "still undelivered" in producer.stats.errors[0]


def test_a_full_local_queue_waits_for_room_instead_of_dropping() -> None:
    producer, client = make(room=2)
    assert producer.send_many([(event(n), None) for n in range(10)]) == 10
    producer.flush()
    assert len(client.delivered) == 10


def test_a_record_refused_locally_is_reported_not_raised() -> None:
    client = FakeClient(lambda error, message: None)
    producer = EventProducer(KAFKA, ProducerSettings(), producer=client, validate_records=False)
    producer.send(b"x" * 20_000, b"k")  # unvalidated, then refused by the client
    producer.send_many([(b"y" * 20_000, b"k")])
    assert producer.stats.failed == 2
    assert producer.stats.errors[0].startswith("events: ")
    assert "Message size too large" in producer.stats.errors[0]


@pytest.mark.parametrize("reports", ["errors", "all"])
def test_delivery_report_modes_agree(reports: str) -> None:
    producer, client = make(delivery_reports=reports)
    if reports == "all":
        # The fake reports successes only when asked to, like librdkafka.
        original = client.poll

        def poll_all(timeout: float = 0) -> int:
            for topic, value, _, _ in client.queue:
                if value not in client.fail:
                    producer._on_delivery(None, FakeMessage(topic))  # type: ignore[arg-type]
            return original(timeout)

        client.poll = poll_all  # type: ignore[method-assign]
    producer.send_many([(event(n), None) for n in range(5)])
    producer.send(b"{}")
    producer.flush()
    assert (producer.stats.delivered, producer.stats.dead_letter_delivered) == (5, 1)
