"""Archived events for Spark tests: rows of ``master/events`` built inline, and a writer that
appends them to a lake's ``master/events`` with Spark (as the archiver does)."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import SparkSession

from events.model import Event
from events.records import EVENTS_SCHEMA
from lake.catalog import MASTER_EVENTS
from lake.frames import commit_frame
from lake.settings import LakeSettings


def event(
    event_id: str, kind: str, when: dt.datetime, ad: str = "ad-1", offset: int = 0
) -> dict[str, object]:
    """One archived event (``master/events`` row) of type ``kind`` at ``when``."""
    return {
        "event_id": event_id,
        "event_type": kind,
        "event_time": when,
        "impression_id": f"i-{event_id}",
        "ad_id": ad,
        "campaign_id": "cmp-1",
        "site_id": "site-1",
        "country": "US",
        "device_type": "mobile",
        "user_id": "u",
        "schema_version": 1,
        "event_date": when.date(),
        "kafka_partition": 0,
        "kafka_offset": offset,
        "ingest_time": when,
    }


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


def archived(e: Event, offset: int) -> dict[str, object]:
    """The ``master/events`` row of a generated event archived at Kafka ``offset``."""
    when = dt.datetime.fromtimestamp(e.event_time / 1000, dt.UTC)
    return {
        "event_id": e.event_id,
        "event_type": e.event_type,
        "event_time": when,
        "impression_id": e.impression_id,
        "ad_id": e.ad_id,
        "campaign_id": e.campaign_id,
        "site_id": e.site_id,
        "country": e.country,
        "device_type": e.device_type,
        "user_id": e.user_id,
        "schema_version": 1,
        "event_date": when.date(),
        "kafka_partition": 0,
        "kafka_offset": offset,
        "ingest_time": when + dt.timedelta(seconds=1),
    }
