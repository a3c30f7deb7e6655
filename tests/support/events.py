"""The tests' one event factory: an event as ad servers send it (the Kafka wire form: JSON,
epoch milliseconds), the ``master/events`` row the archiver makes of it, a writer that appends
such rows with Spark (as the archiver's commit does), and a sender that puts wire events on a
test's topic through the platform's producer."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from events.model import Event
from events.records import EVENTS_SCHEMA
from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from lake.catalog import MASTER_EVENTS
from lake.frames import commit_frame
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def wire_event(
    event_id: str, kind: str, when: dt.datetime, ad: str = "ad-1", **fields: Any
) -> dict[str, object]:
    """One event of type ``kind`` at ``when``, in the wire form; ``fields`` replace the
    defaults (impression ``i-<event_id>``, campaign ``cmp-1``, site ``site-1``, US, mobile,
    user ``u``)."""
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
        **fields,
    }


def archived_row(
    wire: Mapping[str, object],
    offset: int = 0,
    *,
    partition: int = 0,
    ingested_after: dt.timedelta = dt.timedelta(0),
) -> dict[str, object]:
    """The ``master/events`` row of the wire event ``wire`` read at Kafka ``offset``."""
    millis = wire["event_time"]
    assert isinstance(millis, int)
    when = dt.datetime.fromtimestamp(millis / 1000, dt.UTC)
    return {
        **wire,
        "event_time": when,
        "event_date": when.date(),
        "kafka_partition": partition,
        "kafka_offset": offset,
        "ingest_time": when + ingested_after,
    }


def event(
    event_id: str, kind: str, when: dt.datetime, ad: str = "ad-1", offset: int = 0
) -> dict[str, object]:
    """One archived event (``master/events`` row) of type ``kind`` at ``when``."""
    return archived_row(wire_event(event_id, kind, when, ad), offset)


def archived(e: Event, offset: int) -> dict[str, object]:
    """The ``master/events`` row of a generated event archived at Kafka ``offset``, a second
    after its time."""
    return archived_row(msgspec.to_builtins(e), offset, ingested_after=dt.timedelta(seconds=1))


def archive(spark: SparkSession, lake: LakeSettings, rows: list[dict[str, object]]) -> None:
    """Append ``rows`` to the lake's ``master/events``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    frame = spark.createDataFrame(
        [tuple(r[name] for name in EVENTS_SCHEMA.names) for r in rows],
        from_arrow_schema(EVENTS_SCHEMA),
    )
    commit_frame(
        frame,
        MASTER_EVENTS.path(lake),
        lake.object_store,
        EVENTS_SCHEMA,
        partition_by=["event_date"],
    )


def send(topics: KafkaSettings, *events: Mapping[str, object], raw: bytes | None = None) -> None:
    """Produce ``events`` (and one ``raw`` record) to the event topic, unvalidated."""
    with EventProducer(topics, ProducerSettings(), validate_records=False) as producer:
        producer.send_many((orjson.dumps(e), str(e["impression_id"]).encode()) for e in events)
        if raw is not None:
            producer.send_many([(raw, None)])
