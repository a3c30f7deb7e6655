"""Faults: a batch job killed mid-write, the API read while the batch layer rewrites what it
serves, and a broker that lost its log. (SIGKILLs of the archiver and the speed job while
traffic flows are in tests/integration/test_archiver.py and tests/integration/test_speed.py;
`make test-faults` runs all of them longer.)"""

from __future__ import annotations

import datetime as dt
import functools
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pydantic import SecretStr
from pyspark.sql import SparkSession

from api.settings import ApiSettings
from batch_layer.interval import Interval
from batch_layer.job import run as run_batch
from events.records import EVENTS_SCHEMA
from infra.broker import LocalKafka, free_port
from infra.broker_settings import BrokerSettings
from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from master_dataset.archiver import run as run_archiver
from master_dataset.settings import ArchiverSettings
from runtime.kafka_settings import KafkaSettings
from runtime.spark_settings import SparkSettings
from runtime.topics import ensure_topics
from speed_layer.job import run as run_speed
from speed_layer.settings import SpeedSettings
from tests.support import faults
from tests.support.api_server import running_api
from tests.support.events import event
from tests.support.waiting import wait_until

pytestmark = pytest.mark.faults

CTR = str(Path(sys.executable).with_name("ctr"))
TOKEN = "faults-test-token-0123456789"
T0 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)
INTERVAL = Interval(T0, T0 + dt.timedelta(hours=1))
_RANGE = {"start": INTERVAL.start.isoformat(), "end": INTERVAL.end.isoformat()}


def _events(n: int, seed: int, first_offset: int) -> pa.Table:
    """``n`` master/events rows in INTERVAL: 1-in-10 clicks, over 4 ads."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        when = T0 + dt.timedelta(seconds=rng.randrange(3600))
        kind = "click" if i % 10 == 0 else "impression"
        rows.append(event(f"s{seed}-{i}", kind, when, ad=f"ad-{i % 4}", offset=first_offset + i))
    return pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)


def _view(lake: LakeSettings) -> Counter[tuple[object, ...]]:
    rows = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table().to_pylist()
    return Counter((r["bucket_start"], r["ad_id"], r["impressions"], r["clicks"]) for r in rows)


def _coverage_versions(lake: LakeSettings) -> list[int]:
    table = DeltaTable(lake.table("batch/coverage")).to_pyarrow_table()
    return sorted(table.column("input_version").to_pylist())


@pytest.fixture
def rewritten_lake(
    spark: SparkSession, lake: LakeSettings, spark_settings: SparkSettings
) -> tuple[LakeSettings, Counter[tuple[object, ...]], int]:
    """A lake whose INTERVAL is covered by a run over 2,000 events, then 1,000 more events
    arrive: a rerun must replace the interval's rows. Returns (lake, old rows, new version)."""
    write_deltalake(
        MASTER_EVENTS.path(lake), _events(2000, seed=1, first_offset=0), partition_by="event_date"
    )
    run_batch(spark, INTERVAL, lake=lake)
    old = _view(lake)
    write_deltalake(
        MASTER_EVENTS.path(lake), _events(1000, seed=2, first_offset=2000), mode="append"
    )
    return lake, old, DeltaTable(MASTER_EVENTS.path(lake)).version()


def _kill_batch_at(step: str, lake: LakeSettings, env: dict[str, str]) -> None:
    """Run `ctr batch` for INTERVAL, let it stop itself right after printing ``step``
    (--pause-after), then SIGKILL it (driver and JVM): it dies exactly there, however busy the
    machine (a kill sent on reading the line could land steps later)."""
    with subprocess.Popen(
        [
            CTR, "batch", "--start", INTERVAL.start.isoformat(), "--end", INTERVAL.end.isoformat(),
            "--pause-after", step,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:  # fmt: skip
        assert process.stderr is not None
        for line in process.stderr:
            if step in line:
                wait_until(
                    lambda: _stopped(process.pid),
                    timeout_s=60,
                    what=f"`ctr batch` stopped itself after {step!r}",
                )
                os.killpg(process.pid, signal.SIGKILL)
                break
        else:
            pytest.fail(f"`ctr batch` ended without printing {step!r} (exit {process.wait()})")
        process.wait(timeout=30)


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state T in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


@pytest.mark.timeout(faults.timeout(600))
def test_a_batch_job_killed_mid_write_leaves_the_old_state_or_the_new_one(
    spark: SparkSession,
    rewritten_lake: tuple[LakeSettings, Counter[tuple[object, ...]], int],
) -> None:
    lake, old, version = rewritten_lake
    covered_before = _coverage_versions(lake)
    env = {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "COLUMNS": "200",
        "SPARK_SHUFFLE_PARTITIONS": "2",
    }
    seen_after_data_commit = []
    # While the view's files are written, then between the view's commit and the coverage row.
    for step in ["replacing", "recording coverage"] * faults.ROUNDS:
        _kill_batch_at(step, lake, env)
        assert _coverage_versions(lake) == covered_before, "coverage without a finished run"
        if step == "replacing":
            assert _view(lake) == old, "a killed write must leave the interval's old rows"
        else:
            seen_after_data_commit.append(_view(lake))

    run_batch(spark, INTERVAL, lake=lake)  # the rerun completes
    new = _view(lake)
    assert new != old
    assert sum(r[2] + r[3] for r in new) == 3000  # type: ignore[operator]
    assert all(view == new for view in seen_after_data_commit), "never a mix"
    assert _coverage_versions(lake) == [*covered_before, version]


@pytest.mark.timeout(faults.timeout(600))
def test_the_api_never_serves_half_a_rewrite(
    spark: SparkSession,
    rewritten_lake: tuple[LakeSettings, Counter[tuple[object, ...]], int],
) -> None:
    lake, old, _ = rewritten_lake
    old_per_ad = _per_ad(old)
    answers: list[dict[str, tuple[int, int]]] = []
    errors: list[str] = []
    done = threading.Event()

    def load(url: str) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            while not done.is_set():
                response = http.get(
                    "/api/v1/ctr",
                    params={**_RANGE, "granularity": "hour", "group_by": "ad_id"},
                )
                if response.status_code != 200:
                    errors.append(response.text)
                    continue
                answers.append(
                    {r["ad_id"]: (r["impressions"], r["clicks"]) for r in response.json()["rows"]}
                )

    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with running_api(settings, lake) as url:
        clients = [threading.Thread(target=load, args=(url,)) for _ in range(4)]
        for client in clients:
            client.start()
        try:
            wait_until(lambda: answers, timeout_s=120, what="the clients were answered")
            for _ in range(faults.ROUNDS):
                run_batch(spark, INTERVAL, lake=lake)
            # One answer more than there are clients: at least one asked after the last rewrite.
            after = len(answers) + len(clients) + 1
            wait_until(
                lambda: len(answers) >= after, timeout_s=120, what="answers after the rewrites"
            )
        finally:
            done.set()
            for client in clients:
                client.join(timeout=60)
    new_per_ad = _per_ad(_view(lake))
    assert not errors
    assert old_per_ad != new_per_ad
    seen = Counter(
        "old" if a == old_per_ad else "new" if a == new_per_ad else "mixed" for a in answers
    )
    assert seen["mixed"] == 0, "a response mixed the old and the new rows"
    assert seen["old"] > 0
    assert seen["new"] > 0


def _per_ad(view: Counter[tuple[object, ...]]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for (_, ad, impressions, clicks), n in view.items():
        i, c = totals.get(str(ad), (0, 0))
        totals[str(ad)] = (i + int(str(impressions)) * n, c + int(str(clicks)) * n)
    return totals


@pytest.mark.timeout(300)
def test_a_broker_that_lost_its_log_is_reported_not_skipped(
    spark: SparkSession, lake: LakeSettings, tmp_path: Path
) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", topic="restarted")
    broker = LocalKafka(
        kafka, BrokerSettings(run_dir=tmp_path / "run", controller_port=free_port())
    )

    def send(n: int) -> None:
        event = {
            "event_type": "impression",
            "event_time": 1_790_000_000_000,
            "impression_id": "i",
            "ad_id": "a",
            "campaign_id": "c",
            "site_id": "s",
            "country": "US",
            "device_type": "mobile",
            "user_id": "u",
            "schema_version": 1,
        }
        with EventProducer(kafka, ProducerSettings()) as producer:
            producer.send_many(
                [(orjson.dumps({**event, "event_id": f"e{i}"}), b"k") for i in range(n)]
            )

    # Each job reads what the topic holds and stops: how many records it read.
    archive = functools.partial(
        run_archiver, spark, kafka=kafka, lake=lake, settings=ArchiverSettings(), available_now=True
    )
    speed = functools.partial(
        run_speed, spark, kafka=kafka, lake=lake, settings=SpeedSettings(), available_now=True
    )

    broker.start()
    try:
        ensure_topics(kafka)
        send(20)
        assert archive() == 20
        assert speed() == 20
        broker.stop(delete_data=True)  # the log is gone (a new cluster on the same address)
        broker.start()
        ensure_topics(kafka)
        send(3)
        for job in (archive, speed):
            with pytest.raises(RuntimeError, match="lost records") as caught:
                job()
            assert "failOnDataLoss=false" in str(caught.value)  # (the timeout catches a hang)
        assert DeltaTable(MASTER_EVENTS.path(lake)).count() == 20  # nothing skipped silently
        # Told to skip what is lost, both go on from where the log is now. Spark's kafka source
        # cannot tell the new log's first offsets from the lost ones below its checkpoint: the
        # 3 records sent before are skipped too (and reported in the log), later ones are read.
        skip_archiver = ArchiverSettings(fail_on_data_loss=False)
        skip_speed = SpeedSettings(fail_on_data_loss=False)
        assert archive(settings=skip_archiver) == 0
        assert speed(settings=skip_speed) == 0
        send(5)
        assert archive(settings=skip_archiver) == 5
        assert speed(settings=skip_speed) == 5
    finally:
        broker.stop(delete_data=True)
    assert DeltaTable(MASTER_EVENTS.path(lake)).count() == 25
