"""End to end: generated traffic (duplicates, late events, malformed records) through Kafka,
the archiver, the speed layer and the batch layer, read back through the HTTP API and compared
with the generator's ground truth.

The promises checked: batch-covered buckets are exact and say so; uncovered buckets come from
the speed layer and differ from the truth only by the injected duplicates and the late events
it dropped (and counted); once the batch layer covers everything, the whole range is exact; the
SQL endpoint agrees with the API.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable
from pydantic import SecretStr
from pyspark.sql import SparkSession

from api.settings import ApiSettings
from batch_layer.interval import Interval
from batch_layer.job import run as run_batch
from events.model import Event, validate
from ingest.ground_truth import read_csv
from lake.catalog import MASTER_REJECTED
from lake.settings import LakeSettings
from master_dataset.archiver import run as run_archiver
from master_dataset.settings import ArchiverSettings
from runtime.kafka_settings import KafkaSettings
from speed_layer.job import run as run_speed
from speed_layer.settings import SpeedSettings
from tests.support.api_server import running_api
from tests.support.consume import read_topic
from views.columns import DIMENSIONS

CTR = str(Path(sys.executable).with_name("ctr"))
TOKEN = "e2e-test-token-0123456789"
HOUR = dt.timedelta(hours=1)
Key = tuple[int, str, str, str, str, str]  # (bucket ms, campaign, ad, site, country, device)


def _hour_floor(value: dt.datetime) -> dt.datetime:
    return value.replace(minute=0, second=0, microsecond=0)


def _api_rows(url: str, start: dt.datetime, end: dt.datetime) -> dict[Key, dict[str, object]]:
    response = httpx.get(
        f"{url}/api/v1/ctr",
        params={
            "start": start.isoformat(),
            "end": end.isoformat(),
            "granularity": "minute",
            "group_by": ",".join(DIMENSIONS),
            "limit": "100000",
        },
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    rows: dict[Key, dict[str, object]] = {}
    for row in response.json()["rows"]:
        bucket = dt.datetime.fromisoformat(str(row["bucket_start"]).replace("Z", "+00:00"))
        campaign, ad, site, country, device = (str(row[d]) for d in DIMENSIONS)
        key = (int(bucket.timestamp() * 1000), campaign, ad, site, country, device)
        assert key not in rows, f"two rows for {key}"
        rows[key] = row
    return rows


def _sql_totals(url: str, start: dt.datetime, end: dt.datetime) -> tuple[int, int]:
    sql = (
        "SELECT sum(impressions), sum(clicks) FROM ctr "
        f"WHERE bucket_start >= TIMESTAMPTZ '{start.isoformat()}' "
        f"AND bucket_start < TIMESTAMPTZ '{end.isoformat()}'"
    )
    response = httpx.post(
        f"{url}/api/v1/sql",
        json={"sql": sql},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    impressions, clicks = response.json()["rows"][0]
    return int(impressions or 0), int(clicks or 0)


def _topic_counts(topics: KafkaSettings) -> tuple[Counter[tuple[Key, str]], int]:
    """Valid records on the topic per (key, event type) — the truth plus the duplicates —
    and the number of invalid records."""
    counts: Counter[tuple[Key, str]] = Counter()
    invalid = 0
    now_ms = int(time.time() * 1000)
    for record in read_topic(topics, topics.topic):
        event = validate(record.value, now_ms)
        if not isinstance(event, Event):
            invalid += 1
            continue
        key = (
            event.event_time - event.event_time % 60_000,
            event.campaign_id,
            event.ad_id,
            event.site_id,
            event.country,
            event.device_type,
        )
        counts[(key, event.event_type)] += 1
    return counts, invalid


def _late_per_bucket(lake: LakeSettings) -> Counter[int]:
    path = lake.table("speed/late")
    late: Counter[int] = Counter()
    if DeltaTable.is_deltatable(path):
        for r in DeltaTable(path).to_pyarrow_table().to_pylist():
            late[int(r["bucket_start"].timestamp() * 1000)] += r["impressions"] + r["clicks"]
    return late


def _produce(start: dt.datetime, truth_file: Path, kafka_env: dict[str, str]) -> None:
    """``ctr produce``: 6000 records from ``start``, one per second of event time."""
    traffic = (
        "--events 6000 --seed 42 --clock-rate 1 --duplicates 0.03 --late 0.05 --malformed 0.02 "
        "--campaigns 3 --sites 4 --skip-validation"
    )
    options = [*traffic.split(), "--start", start.isoformat(), "--ground-truth", str(truth_file)]
    produced = subprocess.run(
        [CTR, "produce", *options],
        env=kafka_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr[-2000:]


def _speed_per_bucket(
    speed: dict[Key, dict[str, object]], on_topic: Counter[tuple[Key, str]]
) -> Counter[int]:
    """Events per bucket in the speed rows, each row checked to be at most what the topic had."""
    per_bucket: Counter[int] = Counter()
    for key, row in speed.items():
        impressions, clicks = int(str(row["impressions"])), int(str(row["clicks"]))
        assert impressions <= on_topic[(key, "impression")]
        assert clicks <= on_topic[(key, "click")]
        per_bucket[key[0]] += impressions + clicks
    return per_bucket


@pytest.mark.timeout(600)
def test_the_api_serves_exact_batch_buckets_and_bounded_speed_buckets(
    spark: SparkSession,
    topics: KafkaSettings,
    kafka_env: dict[str, str],
    lake: LakeSettings,
    tmp_path: Path,
) -> None:
    # 1. Traffic: 100 minutes of event time starting three hours ago (one event per second of
    # event time), with duplicates, late events (10 min to 3 h old) and malformed records.
    start = _hour_floor(dt.datetime.now(dt.UTC)) - 3 * HOUR
    truth_file = tmp_path / "truth.csv"
    _produce(start, truth_file, kafka_env)
    truth = read_csv(truth_file)
    on_topic, invalid = _topic_counts(topics)
    assert invalid > 50  # malformed records reached the topic (and must be quarantined)
    duplicates = sum(on_topic.values()) - sum(i + c for i, c in truth.values())
    assert duplicates > 100

    # 2. Archiver and speed layer catch up (several micro-batches, so the watermark moves).
    archiver, speed_job = (
        ArchiverSettings(max_offsets_per_trigger=2500),
        SpeedSettings(max_offsets_per_trigger=1000),
    )
    run_archiver(spark, kafka=topics, lake=lake, settings=archiver, available_now=True)
    run_speed(spark, kafka=topics, lake=lake, settings=speed_job, available_now=True)
    assert DeltaTable(MASTER_REJECTED.path(lake)).count() == invalid

    # 3. The batch layer covers everything up to one hour after the traffic started.
    first_hour = start + HOUR
    run_batch(spark, Interval(start - 4 * HOUR, first_hour), lake=lake)
    window = (start - 4 * HOUR, start + 2 * HOUR)
    cutoff_ms = int(first_hour.timestamp() * 1000)
    truth_keys = {k for k, (i, c) in truth.items() if i or c}

    api = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with running_api(api, lake) as url:
        rows = _api_rows(url, *window)
        covered = {k: r for k, r in rows.items() if k[0] < cutoff_ms}
        speed = {k: r for k, r in rows.items() if k[0] >= cutoff_ms}
        assert covered
        assert speed

        # Covered buckets: exactly the truth, and they say so.
        assert {r["source"] for r in covered.values()} == {"batch"}
        assert set(covered) == {k for k in truth_keys if k[0] < cutoff_ms}
        for key, row in covered.items():
            assert (row["impressions"], row["clicks"]) == truth[key], key

        # Uncovered buckets: speed, never more than truth + duplicates; what is missing per
        # bucket is exactly what the speed layer dropped as late and counted in speed/late.
        assert {r["source"] for r in speed.values()} == {"speed"}
        late = _late_per_bucket(lake)
        assert sum(late.values()) > 0, "the traffic should have had events beyond the watermark"
        per_bucket_api = _speed_per_bucket(speed, on_topic)
        per_bucket_topic: Counter[int] = Counter()
        for (key, _), n in on_topic.items():
            if cutoff_ms <= key[0] < int(window[1].timestamp() * 1000):
                per_bucket_topic[key[0]] += n
        for bucket, n in per_bucket_topic.items():
            assert per_bucket_api[bucket] + late[bucket] == n, dt.datetime.fromtimestamp(
                bucket / 1000, dt.UTC
            )
        speed_total = sum(per_bucket_api.values())
        truth_total = sum(i + c for k, (i, c) in truth.items() if k[0] >= cutoff_ms)
        assert speed_total != truth_total  # approximate: the duplicates show

        # The SQL endpoint's merged view agrees with the API.
        api_impressions = sum(int(str(r["impressions"])) for r in rows.values())
        api_clicks = sum(int(str(r["clicks"])) for r in rows.values())
        assert _sql_totals(url, *window) == (api_impressions, api_clicks)

        # 4. The batch layer covers the rest: the whole range is exact.
        run_batch(spark, Interval(first_hour, window[1]), lake=lake)
        rows = _api_rows(url, *window)
        assert {r["source"] for r in rows.values()} == {"batch"}
        assert {k: (r["impressions"], r["clicks"]) for k, r in rows.items()} == {
            k: truth[k] for k in truth_keys
        }
        assert _sql_totals(url, *window) == (
            sum(i for i, _ in truth.values()),
            sum(c for _, c in truth.values()),
        )
