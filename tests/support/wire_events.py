"""Events as ad servers send them (the Kafka wire form: JSON, epoch milliseconds), and a sender
that puts them on a test's topic through the platform's producer."""

from __future__ import annotations

import datetime as dt

import orjson

from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from runtime.kafka_settings import KafkaSettings


def wire_event(event_id: str, kind: str, when: dt.datetime, ad: str = "ad-1") -> dict[str, object]:
    """One event of type ``kind`` at ``when``, in the wire form."""
    return {
        "event_id": event_id,
        "event_type": kind,
        "event_time": int(when.timestamp() * 1000),
        "impression_id": f"i-{event_id}",
        "ad_id": ad,
        "campaign_id": "cmp-1",
        "site_id": "site-1",
        "country": "US",
        "device_type": "mobile",
        "user_id": "u",
        "schema_version": 1,
    }


def send(topics: KafkaSettings, *events: dict[str, object], raw: bytes | None = None) -> None:
    """Produce ``events`` (and one ``raw`` record) to the event topic, unvalidated."""
    with EventProducer(topics, ProducerSettings(), validate_records=False) as producer:
        producer.send_many((orjson.dumps(e), str(e["impression_id"]).encode()) for e in events)
        if raw is not None:
            producer.send_many([(raw, None)])
