"""Bad input through the whole pipeline, against the real broker, Spark, Delta and HTTP API.

A matrix of bad records, plus valid ones, goes to the event topic twice: raw, as a foreign
producer would send it (no validation), and through the project's producer, which must
dead-letter every bad one with its reason. Then the archiver must put each raw bad record in
``master/rejected`` exactly once with its reason and each valid one in ``master/events``; the
speed layer must count the bad ones and carry on; and ``/metrics`` must show the counts.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from pyspark.sql import SparkSession

from api.settings import ApiSettings
from infra.broker import free_port
from ingest.producer import REASON_HEADER, SOURCE_HEADER, TOPIC_HEADER, EventProducer
from ingest.settings import ProducerSettings
from lake.catalog import MASTER_EVENTS, MASTER_REJECTED
from lake.settings import LakeSettings
from lake.speed_status import read_status, write_status
from master_dataset.archiver import run as run_archiver
from master_dataset.settings import ArchiverSettings
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import StreamProgress
from speed_layer.job import run as run_speed
from speed_layer.settings import SpeedSettings
from tests.support.api_server import running_api
from tests.support.consume import read_topic

TOKEN = "bad-input-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW_MS = int(time.time() * 1000)  # Kafka stamps records with the send time: the reference
MINUTE = 60_000


def event(n: int, **changes: Any) -> dict[str, Any]:
    return {
        "event_id": f"evt-{n}",
        "event_type": "impression",
        "event_time": NOW_MS - 5 * MINUTE + n,
        "impression_id": f"imp-{n}",
        "ad_id": "ad-1",
        "campaign_id": "cmp-1",
        "site_id": "site-1",
        "country": "DE",
        "device_type": "mobile",
        "user_id": f"user-{n}",
        "schema_version": 1,
        **changes,
    }


def without(record: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in names}


def js(obj: Any) -> bytes:
    return orjson.dumps(obj)


# case id (also the Kafka key) -> (value, the reason it must be refused with: a prefix)
BAD: dict[str, tuple[bytes, str]] = {
    "not-json": (b"impression,ad-1,cmp-1,DE", "record: not valid JSON ("),
    "truncated": (js(event(1))[:50], "record: not valid JSON ("),
    "empty-value": (b"", "record: not valid JSON ("),
    "bom": (b"\xef\xbb\xbf" + js(event(2)), "record: not valid JSON (UTF-8 byte order mark"),
    "nan-time": (
        js(event(3)).replace(str(NOW_MS - 5 * MINUTE + 3).encode(), b"NaN"),
        "record: not valid JSON (",
    ),
    "binary-garbage": (bytes(range(256)) * 4, "record: not valid UTF-8 ("),
    "invalid-utf8-in-field": (
        js(event(4)).replace(b"user-4", b"user-\xc3\x28"),
        "record: not valid UTF-8 (",
    ),
    "deeply-nested": (
        js(event(5))[:-1] + b',"x":' + b"[" * 600 + b"]" * 600 + b"}",
        "record: JSON nested deeper than 512 levels",
    ),
    "oversize": (js(event(6, note="n" * 9000)), "record: 9"),  # "record: 9… bytes exceeds"
    "array": (js([event(7)]), "record: expected a JSON object, got array"),
    "string": (b'"an impression"', "record: expected a JSON object, got string"),
    "number": (b"1700000000000", "record: expected a JSON object, got number"),
    "null": (b"null", "record: expected a JSON object, got null"),
    "empty-object": (b"{}", "record: missing field(s) event_id, event_type, event_time"),
    "missing-fields": (
        js(without(event(8), "country", "user_id")),
        "record: missing field(s) country, user_id",
    ),
    "time-as-string": (
        js(event(9, event_time=str(NOW_MS))),
        "event_time: must be an integer (epoch milliseconds), got '",
    ),
    "id-as-number": (js(event(10, ad_id=17)), "ad_id: must be a string, got number"),
    "schema-as-string": (js(event(11, schema_version="1")), "schema_version: must be 1, got '1'"),
    "far-future": (js(event(12, event_time=NOW_MS + 86_400_000)), "event_time: "),
    "ancient": (
        js(event(13, event_time=946_684_800_000)),
        "event_time: 946684800000 is before 1262304000000 (ancient",
    ),
    "time-in-seconds": (js(event(14, event_time=NOW_MS // 1000)), "event_time: "),
    "time-beyond-64-bits": (
        js(event(15)).replace(str(NOW_MS - 5 * MINUTE + 15).encode(), b"9" * 30),
        "event_time: must be a 64-bit integer",
    ),
    "unknown-event-type": (
        js(event(16, event_type="conversion")),
        "event_type: must be 'impression' or 'click', got 'conversion'",
    ),
    "unknown-device": (js(event(17, device_type="fridge")), "device_type: must be one of"),
    "repeated-key": (
        b'{"country":"XX",' + js(event(18))[1:],
        "country: a repeated key with an invalid occurrence",
    ),
}
VALID: dict[str, bytes] = {
    **{
        f"valid-{n}": js(event(100 + n, event_type="click" if n % 3 == 0 else "impression"))
        for n in range(8)
    },
    "valid-unknown-field": js(event(120, campaign_name="spring")),
    "valid-repeated-key": b'{"country":"FR",' + js(event(121))[1:],  # the last one wins: DE
}
EXPECTED_KINDS = Counter(reason.split(":", 1)[0] for _, reason in BAD.values())


def _event_id(value: bytes) -> str:
    return str(orjson.loads(value)["event_id"])


def _produce_raw(topics: KafkaSettings) -> None:
    """Every case, untouched, straight to the event topic (plus a record with no value)."""
    producer = Producer(topics.client(acks="all"))
    for case, (value, _) in BAD.items():
        producer.produce(topics.topic, value=value, key=case.encode())
    for case, value in VALID.items():
        producer.produce(topics.topic, value=value, key=case.encode())
    producer.produce(topics.topic, value=None, key=b"tombstone")
    assert producer.flush(30) == 0


def _produce_validated(topics: KafkaSettings) -> None:
    """Every case through the project's producer: bad ones must go to the dead-letter topic."""
    with EventProducer(topics, ProducerSettings()) as producer:
        for case, (value, _) in BAD.items():
            assert not producer.send(value, f"producer/{case}".encode())
        for case, value in VALID.items():
            # Same events under new ids, so master/events tells the two paths apart.
            renamed = value.replace(b'"evt-', b'"p-evt-')
            assert producer.send(renamed, f"producer/{case}".encode())
    assert producer.stats.dead_lettered == len(BAD)
    assert producer.stats.failed == producer.stats.failed_dead_letter == 0


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_bad_record_is_dead_lettered_or_quarantined_with_its_reason(
    spark: SparkSession,
    topics: KafkaSettings,
    lake: LakeSettings,
) -> None:
    _produce_raw(topics)
    _produce_validated(topics)

    # 1. The producer's path: each bad record in the DLQ once, untouched, with its reason.
    dead = {r.key: r for r in read_topic(topics, topics.dlq_topic)}
    assert set(dead) == {f"producer/{case}".encode() for case in BAD}
    for case, (value, reason) in BAD.items():
        record = dead[f"producer/{case}".encode()]
        assert record.value == value, case
        assert record.headers[REASON_HEADER].decode().startswith(reason), (case, record.headers)
        assert record.headers[SOURCE_HEADER] == b"producer"
        assert record.headers[TOPIC_HEADER] == topics.topic.encode()

    # 2. The archiver: every record of the topic in exactly one table, exactly once.
    on_topic = read_topic(topics, topics.topic)
    assert len(on_topic) == len(BAD) + 2 * len(VALID) + 1
    archived = run_archiver(
        spark, kafka=topics, lake=lake, settings=ArchiverSettings(), available_now=True
    )
    assert archived == len(on_topic)
    rejected = DeltaTable(MASTER_REJECTED.path(lake)).to_pyarrow_table().to_pylist()
    events = DeltaTable(MASTER_EVENTS.path(lake)).to_pyarrow_table()
    assert len(rejected) + events.num_rows == len(on_topic)  # nothing lost, nothing doubled
    by_key = Counter(row["key"] for row in rejected)
    assert by_key == Counter([case.encode() for case in BAD] + [b"tombstone"])
    for row in rejected:
        case = row["key"].decode()
        if case == "tombstone":
            assert (row["value"], row["reason"]) == (None, "record: no value (a null Kafka record)")
            continue
        value, reason = BAD[case]
        assert row["value"] == value, case  # the raw bytes, for a later fix and replay
        assert row["reason"].startswith(reason), (case, row["reason"])
        assert len(row["reason"]) <= 200, (case, row["reason"])
        assert row["kafka_topic"] == topics.topic
    expected_ids = [_event_id(v) for v in VALID.values()]
    expected_ids += [f"p-{i}" for i in expected_ids]
    assert sorted(events.column("event_id").to_pylist()) == sorted(expected_ids)
    countries = {row["event_id"]: row["country"] for row in events.to_pylist()}
    assert countries["evt-121"] == "DE"  # a repeated key: the last occurrence wins

    # 3. The speed layer reads the same topic, skips and counts the bad records.
    run_speed(spark, kafka=topics, lake=lake, settings=SpeedSettings(), available_now=True)
    status = read_status(lake)
    assert status is not None
    assert status["invalid_records_total"] == len(BAD) + 1
    speed = DeltaTable(lake.table("speed/ctr")).to_pyarrow_table()
    assert sum(speed.column("impressions").to_pylist()) + sum(
        speed.column("clicks").to_pylist()
    ) == 2 * len(VALID)

    # 4. /metrics: quarantined by reason kind, table rows, DLQ depth, speed's invalid count.
    api = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0, dlq_refresh_s=0)
    with running_api(api, lake, topics) as url:
        samples = _metrics(url)
    rejected_kinds = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "ctr_rejected_records_total"
    }
    assert rejected_kinds == {**EXPECTED_KINDS, "record": EXPECTED_KINDS["record"] + 1}
    rows = {
        dict(labels)["table"]: value
        for (name, labels), value in samples.items()
        if name == "ctr_table_rows"
    }
    assert rows["master/rejected"] == len(BAD) + 1
    assert rows["master/events"] == 2 * len(VALID)
    assert rows["speed/ctr"] == speed.num_rows
    assert rows["batch/ctr"] == 0
    assert samples[("ctr_dlq_records", (("topic", topics.dlq_topic),))] == len(BAD)
    assert samples[("ctr_speed_invalid_records_total", ())] == len(BAD) + 1


def test_metrics_leave_out_the_dlq_depth_when_kafka_is_unreachable(
    lake: LakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    nobody = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    api = ApiSettings(token=SecretStr(TOKEN), kafka_timeout_s=0.5, dlq_refresh_s=0)
    with (
        caplog.at_level(logging.WARNING, logger="api.topic_depth"),
        running_api(api, lake, nobody) as url,
    ):
        # The client timeout is a hang guard (the lookup gives up after 0.5 s), not a speed
        # check: a scrape that waits on the missing broker fails with ReadTimeout.
        first = httpx.get(f"{url}/metrics", headers=AUTH, timeout=10)
        second = httpx.get(f"{url}/metrics", headers=AUTH, timeout=10)
    assert first.status_code == second.status_code == 200
    assert "ctr_dlq_records" not in first.text + second.text
    assert "ctr_table_rows" in first.text  # the rest of the scrape is there
    warnings = [r for r in caplog.records if "cannot read the depth" in r.getMessage()]
    assert len(warnings) == 1, "one log line when Kafka goes away, not one per scrape"


def _progress(batch_id: int, invalid: int) -> StreamProgress:
    return StreamProgress(
        batch_id=batch_id,
        input_rows=10,
        input_rows_per_second=1.0,
        processed_rows_per_second=1.0,
        batch_duration_ms=5,
        watermark=None,
        offsets_behind=0,
        metrics={"speed.invalid": invalid},
    )


def test_speed_status_keeps_a_running_total_of_invalid_records(lake: LakeSettings) -> None:
    now = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    totals = []
    # batches 0, 1, 1 again (reported twice: counted once), 2; then a new checkpoint (0).
    for batch_id, invalid in [(0, 3), (1, 4), (1, 4), (2, 0), (0, 5)]:
        write_status(lake, _progress(batch_id, invalid), now=now)
        status = read_status(lake)
        assert status is not None
        assert status["invalid_records"] == invalid
        totals.append(status["invalid_records_total"])
    assert totals == [3, 7, 7, 7, 5]
