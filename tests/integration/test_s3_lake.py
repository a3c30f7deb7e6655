"""The lake on a real S3-compatible server (SeaweedFS, started as `ctr s3 up` starts it): the
pipeline end to end through the `ctr` entry points (produce -> archive -> batch -> speed -> the
API), with the streaming jobs' checkpoints, the attribution state and the speed job's status on
the server too, whose answers equal the local-disk run's on the same events exactly; the SQL
sandbox reads
the views there and nothing else; and the tables with two writing processes stay whole under
conflicting commits (delta-rs' conditional writes)."""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from infra.broker import free_port
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from ingest.producer import EventProducer
from ingest.send_loop import produce
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from tests.support.waiting import wait_until

CTR = str(Path(sys.executable).with_name("ctr"))
TOKEN = "s3-test-token-0123456789"
H0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
H1, H2 = H0 + dt.timedelta(hours=1), H0 + dt.timedelta(hours=2)


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    """The local S3 server, its bucket created and its env file written."""
    run_dir = tmp_path_factory.mktemp("s3-run")
    store = LocalS3(LocalS3Settings(run_dir=run_dir, port=free_base_port(), bucket="ctr-test"))
    assert store.start()
    try:
        yield store
    finally:
        # The scratch server's data goes with it: killed, not waited for (a stop keeping the
        # data takes ~15 s); its data directory removed.
        assert store.stop(discard=True)
        assert store.pid() is None
        assert not (store.dir / "data").exists()


def s3_lake_env(store: LocalS3, prefix: str) -> dict[str, str]:
    """What `source RUN_DIR/s3/env; LAKE_ROOT=s3://$CTR_S3_BUCKET/<prefix>` gives a job."""
    env = dict(line.removeprefix("export ").split("=", 1) for line in _env_lines(store))
    env["LAKE_ROOT"] = f"s3://{env['CTR_S3_BUCKET']}/{prefix}"
    return env


def _env_lines(store: LocalS3) -> list[str]:
    text = store.env_file.read_text()
    return [line for line in text.splitlines() if line.startswith("export ")]


def ctr(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [CTR, *args], env={**env, "COLUMNS": "200"}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"ctr {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@contextlib.contextmanager
def serving(env: dict[str, str], logs: Path) -> Iterator[httpx.Client]:
    """`ctr serve` on a free port (its log under ``logs``); a client with the token."""
    port = free_port()
    log = logs / f"api-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [CTR, "serve", "--port", str(port)],
            env={**env, "API_TOKEN": TOKEN, "API_REFRESH_S": "0", "API_CACHE_STALE_S": "0"},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as client:

            def healthy() -> bool:
                assert process.poll() is None, log.read_text()
                with contextlib.suppress(httpx.HTTPError):
                    return client.get("/healthz").status_code == 200
                return False

            wait_until(healthy, timeout_s=180, what="the API answers /healthz", poll_s=0.5)
            yield client
    finally:
        process.terminate()
        process.wait(timeout=30)


def answers(client: httpx.Client) -> dict[str, object]:
    """Everything a dashboard reads, without the moments the run happened at."""
    base = {"start": _iso(H0), "end": _iso(H2)}
    found: dict[str, object] = {}
    queries = {
        "minutes by campaign": {**base, "granularity": "minute", "group_by": "campaign_id"},
        "hours by device": {**base, "granularity": "hour", "group_by": "device_type"},
        "all": {**base, "granularity": "all"},
    }
    for name, params in queries.items():
        response = client.get("/api/v1/ctr", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        found[name] = (body["rows"], body["truncated"])
    csv = client.get("/api/v1/ctr", params={**queries["all"], "format": "csv"})
    assert csv.status_code == 200, csv.text
    found["csv"] = csv.text
    for table in ("events", "rejected", "ctr"):
        sql = client.post("/api/v1/sql", json={"sql": f"SELECT count(*) FROM {table}"})
        assert sql.status_code == 200, sql.text
        found[f"sql {table}"] = sql.json()["rows"]
    return found


def run_pipeline(env: dict[str, str], logs: Path) -> dict[str, object]:
    """archive -> batch (the first hour) -> speed -> the API's answers (with the speed job's
    freshness)."""
    ctr(env, "archive", "--available-now")
    ctr(env, "batch", "--start", _iso(H0), "--end", _iso(H1))
    ctr(env, "speed", "--available-now")
    with serving(env, logs) as client:
        found = answers(client)
        freshness = client.get("/api/v1/ctr", params={"granularity": "all"}).json()["freshness"]
        found["speed reported"] = freshness["latest_speed_bucket"] is not None
        return found


def send_events(topics: KafkaSettings) -> None:
    """4,000 events over ~4 minutes of event time across the hour boundary (the first hour's
    minutes come from the batch layer, the next from the speed layer), some duplicated, some
    malformed."""
    config = TrafficConfig(
        seed=29,
        start_ms=int((H1 - dt.timedelta(minutes=2)).timestamp() * 1000),
        events_per_second=16.0,
        campaigns=4,
        duplicate_fraction=0.02,
        malformed_fraction=0.01,
    )
    with EventProducer(topics, ProducerSettings(), validate_records=False) as producer:
        produce(TrafficGenerator(config), producer, limit=4000)
        assert producer.flush(60) == 0


# The pipeline twice (local disk, then S3): about 3 minutes on a quiet machine, 5 under load.
@pytest.mark.timeout(900)
def test_the_pipeline_on_s3_answers_exactly_as_on_local_disk(
    s3: LocalS3, topics: KafkaSettings, kafka_env: dict[str, str], tmp_path: Path
) -> None:
    send_events(topics)
    common = {**kafka_env, "SPARK_SHUFFLE_PARTITIONS": "2", "SPARK_MASTER": "local[2]"}
    local = {
        **common,
        "LAKE_ROOT": str(tmp_path / "lake"),
        "CHECKPOINT_ROOT": str(tmp_path / "ck-local"),
    }
    prefix = f"lake-{uuid.uuid4().hex[:8]}"
    remote = {**common, **s3_lake_env(s3, prefix)}
    # Issue 67: the checkpoints on the store too (a driver on another host finds them).
    remote["CHECKPOINT_ROOT"] = f"s3://{s3.settings.bucket}/{prefix}-checkpoints"

    on_disk = run_pipeline(local, tmp_path)
    on_s3 = run_pipeline(remote, tmp_path)

    assert on_s3 == on_disk
    assert on_s3["speed reported"]
    everything: Any = on_disk["all"]
    assert not everything[1]
    assert everything[0][0]["impressions"] > 3000  # the events were there to compare
    minutes: Any = on_disk["minutes by campaign"]
    sources = {r["source"] for r in minutes[0]}
    assert {"batch", "speed"} <= sources
    # The S3 run's tables are in the bucket, nowhere on disk.
    key = s3.credentials()
    store = pafs.S3FileSystem(
        access_key=key.access_key_id, secret_key=key.secret_access_key, region="us-east-1",
        endpoint_override=f"127.0.0.1:{s3.settings.port}", scheme="http",
    )  # fmt: skip
    for table in ("master/events", "master/rejected", "master/arrivals", "batch/coverage",
                  "speed/ctr"):  # fmt: skip
        log = store.get_file_info(pafs.FileSelector(f"ctr-test/{prefix}/{table}/_delta_log"))
        assert any(info.base_name.endswith(".json") for info in log), table
    # The checkpoints, the attribution state and the status are in the bucket, under
    # CHECKPOINT_ROOT; nothing of them on this disk.
    checkpoints = f"ctr-test/{prefix}-checkpoints"
    kept = {
        info.path.removeprefix(checkpoints + "/")
        for info in store.get_file_info(pafs.FileSelector(checkpoints, recursive=True))
    }
    for job in ("archiver", "speed"):
        assert f"{job}/metadata" in kept
        assert any(k.startswith(f"{job}/commits/") for k in kept), job
    assert "speed.status.json" in kept
    assert any(k.startswith("speed/attribution/partition=") for k in kept)
    assert not (tmp_path / "s3:").exists()


def test_the_sql_sandbox_reads_the_views_on_s3_and_nothing_else(
    s3: LocalS3, topics: KafkaSettings, kafka_env: dict[str, str], tmp_path: Path
) -> None:
    """The API's own database holds the store's secret; the sandbox reads through Arrow and
    has none: no table function, secret or path reaches the bucket from SQL."""
    env = {**kafka_env, **s3_lake_env(s3, f"sandbox-{uuid.uuid4().hex[:8]}")}
    env["CHECKPOINT_ROOT"] = str(tmp_path / "ck")
    with serving(env, tmp_path) as client:
        probes = [
            f"SELECT * FROM read_parquet('s3://{s3.settings.bucket}/**/*.parquet')",
            f"SELECT * FROM read_text('s3://{s3.settings.bucket}/x')",
            "SELECT * FROM duckdb_secrets()",
            "SELECT current_setting('s3_secret_access_key')",
            "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
            f"SELECT * FROM 's3://{s3.settings.bucket}/x.parquet'",
        ]
        for probe in probes:
            response = client.post("/api/v1/sql", json={"sql": probe})
            assert response.status_code == 400, (probe, response.text)
            assert s3.credentials().secret_access_key not in response.text
        ok = client.post("/api/v1/sql", json={"sql": "SELECT count(*) FROM events"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["rows"] == [[0]]


def test_every_table_names_its_writing_processes() -> None:
    from lake.catalog import SERVED, SPEED_LATE

    for table in (*SERVED, SPEED_LATE):
        assert table.writers, table.name


def test_the_api_key_watcher_on_s3_sees_a_revoke_at_its_next_call(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key store (access.key_store, access.key_watcher) on an object store: the
    per-request check is a round trip (remote), a revoke by `ctr keys revoke` reaches the
    watcher at its next call."""
    from access.key_store import create_key, read_keys
    from access.key_watcher import KeyWatcher

    env = s3_lake_env(s3, f"keys-{uuid.uuid4().hex[:8]}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lake = LakeSettings()
    watcher = KeyWatcher(lake)
    assert watcher.check_is_remote
    assert watcher.ring().keys == ()
    _, secret = create_key(lake, "bi", "analyst")
    now = dt.datetime.now(dt.UTC)
    assert watcher.ring().verify(secret, now) is not None
    assert watcher.ring().keys == read_keys(lake).keys
    ctr({**os.environ, **env}, "keys", "revoke", "bi")
    assert watcher.ring().verify(secret, now) is None
    assert watcher.reloads == 3


# -- two writing processes, one table --------------------------------------------------------

T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
APPENDS = 16


def _arrival_rows(minute: int) -> pa.Table:
    from lake.catalog import MASTER_ARRIVALS

    row: dict[str, object] = {name: None for name in MASTER_ARRIVALS.schema.names}
    row.update(
        bucket_start=T0 + dt.timedelta(minutes=minute), impressions=1, clicks=0,
        events_version=minute, batch_id=minute, archived_at=T0,
    )  # fmt: skip
    return pa.Table.from_pylist([row], MASTER_ARRIVALS.schema)


def _archiver(env: dict[str, str]) -> None:
    """master/arrivals' appender, as the archiver appends (one commit per micro-batch)."""
    os.environ.update(env)
    from lake.arrivals import arrivals_table

    table = arrivals_table(LakeSettings())
    for minute in range(APPENDS):
        table.append(_arrival_rows(minute), app_id="archiver", version=minute)


def _batch_cleanup(env: dict[str, str]) -> None:
    """The batch job's clean-up of master/arrivals, racing the appends."""
    os.environ.update(env)
    from lake.arrivals import forget_counted

    for _ in range(8):
        forget_counted(
            LakeSettings(), start=T0, end=T0 + dt.timedelta(minutes=4), input_version=1000,
            attempts=20,
        )  # fmt: skip


def _backfill(env: dict[str, str], hours: list[int]) -> None:
    """Batch runs replacing whole hours of one view table, as ctr_batch and a backfill do: the
    files written (as a Spark task does, lake.data_files.HourFiles), then the driver's commit
    of them and of the removal of the hour's files (lake.view_files)."""
    os.environ.update(env)
    from deltalake.exceptions import CommitFailedError

    from batch_layer.interval import Interval
    from lake import view_files
    from lake.catalog import BATCH_CTR
    from lake.data_files import HourFiles

    lake = LakeSettings()
    path = BATCH_CTR.path(lake)
    for hour in hours:
        start = T0 + dt.timedelta(hours=hour % 4)  # two runs per hour, from both workers
        interval = Interval(start, start + dt.timedelta(hours=1))
        row: dict[str, object] = {name: None for name in BATCH_CTR.schema.names}
        row.update(bucket_start=start, impressions=hour, clicks=0, run_id=f"run-{hour}")
        for _ in range(30):
            table = view_files.open_table(path, lake.object_store, BATCH_CTR.schema)
            replaced = view_files.replaced_files(table, interval)
            files = HourFiles(
                BATCH_CTR.name, path, lake.object_store, BATCH_CTR.schema, "bucket_start"
            )
            files.write(pa.Table.from_pylist([row], BATCH_CTR.schema))
            try:
                view_files.commit(table, files.close(), replaced, interval=interval,
                                  run_id=f"run-{hour}", input_version=hour)  # fmt: skip
                break
            except CommitFailedError:
                continue  # the batch job reruns at once (runtime.connectors.is_commit_conflict)
        else:
            raise AssertionError(f"hour {hour} kept conflicting")


def test_conflicting_writers_on_s3_lose_no_commit(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables two processes write: master/arrivals (the archiver appends while the batch
    job deletes what it counted) and a batch view (ctr_batch, the stale recompute and a backfill
    replace hours of it). Run at once on S3, every commit lands and nothing is overwritten."""
    from lake.catalog import BATCH_CTR, MASTER_ARRIVALS
    from lake.storage import open_delta

    env = {**s3_lake_env(s3, f"race-{uuid.uuid4().hex[:8]}"), "CHECKPOINT_ROOT": "/nonexistent"}
    context = multiprocessing.get_context("spawn")  # delta-rs' runtime does not survive fork
    workers = [
        context.Process(target=_archiver, args=(env,)),
        context.Process(target=_batch_cleanup, args=(env,)),
        context.Process(target=_backfill, args=(env, [0, 1, 2, 3])),
        context.Process(target=_backfill, args=(env, [4, 5, 6, 7])),
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
        assert worker.exitcode == 0
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lake = LakeSettings()
    arrivals = open_delta(MASTER_ARRIVALS.path(lake), lake.object_store)
    assert arrivals.transaction_version("archiver") == APPENDS - 1
    minutes = sorted(
        int((b - T0).total_seconds() // 60)
        for b in arrivals.to_pyarrow_table().column("bucket_start").to_pylist()
    )
    # Every append after minute 4 is there; of the first four, only those appended after the
    # last clean-up (none lost, none doubled).
    assert minutes[-(APPENDS - 4) :] == list(range(4, APPENDS))
    assert len(minutes) == len(set(minutes))
    # Each of the four hours was replaced twice, once by each worker: one row per hour, the
    # later run's, never both (a run that lost the race reran over the winner's file).
    view = open_delta(BATCH_CTR.path(lake), lake.object_store).to_pyarrow_table()
    by_hour = sorted(zip(view.column("bucket_start").to_pylist(),
                         view.column("run_id").to_pylist(), strict=True))  # fmt: skip
    assert [b for b, _ in by_hour] == [T0 + dt.timedelta(hours=h) for h in range(4)]
    assert all(r in {f"run-{h}", f"run-{h + 4}"} for h, (_, r) in enumerate(by_hour))


def test_the_snapshot_follows_new_commits_on_the_object_store(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serving_layer.log_tail on S3: a look for the next commit that is not there is a "not
    found" (not an error), new commits patch the file list into the list delta-rs reads
    whole, and a reload happens only at the first read."""
    from lake.storage import open_delta
    from serving_layer.snapshots import SnapshotSource
    from tests.support.lake_writer import ctr_row, minute, write_speed

    env = s3_lake_env(s3, f"tail-{uuid.uuid4().hex[:8]}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lake = LakeSettings()
    write_speed(lake, [ctr_row(minute(0), 10, 1)])
    source = SnapshotSource(lake, tables=("speed/ctr",), refresh_s=0)
    assert source.current()["speed/ctr"].version == 0
    assert source.current()["speed/ctr"].version == 0  # looked, nothing new
    for m in range(1, 4):
        write_speed(lake, [ctr_row(minute(m), 10, 1)])
    table = source.current()["speed/ctr"]
    whole = open_delta(lake.table("speed/ctr"), lake.object_store)
    assert (table.version, table.files) == (3, tuple(sorted(whole.file_uris())))
    assert source.requests["reload"] == 1
    # Nothing; then three commits and "not there".
    assert source.requests["commit"] == 1 + 3 + 1
