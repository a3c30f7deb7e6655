"""The lake on S3 vs on local disk, in one run: archive, batch and serving.

N events (1 % malformed) are produced into a topic on a broker of its own; the local S3 server
(SeaweedFS, as `ctr s3 up` runs it) starts under a scratch folder. One SparkSession (local[2],
the S3 connector on its class path) then runs, for a lake on local disk and a lake in the
bucket, each twice (local, S3, local, S3; the better run of each is its figure):

* archive: ``ctr archive --available-now``'s job over the whole topic into an empty lake;
* batch: the exact view of the events' hour (the batch job: read master/events, compute,
  commit through delta-rs, coverage and drift);
* serving: the first answer of the serving layer (reading every table's log: the cold start),
  then, QUERIES times, a fresh snapshot (every table's log read again: what the API does when
  the lake has a new version) and a day's query by hour and campaign over it, their medians
  apart (where the time goes).

Ratios are S3 / local (above 1: S3 is slower). Both lakes are on this machine's disk: the
difference is the S3 protocol and server (HTTP per object, listing instead of a directory read),
not a network.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from infra.broker import scratch_broker
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from ingest.producer import EventProducer
from ingest.send_loop import produce
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_EVENTS = 300_000
QUERIES = 15
RESULTS = Path("bench/results")
HOUR = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)


def main(events: int | None = None) -> dict[str, object]:
    events = events or DEFAULT_EVENTS
    with tempfile.TemporaryDirectory(prefix="ctr-bench-storage-") as scratch:
        work = Path(scratch)
        with _s3(work) as store, scratch_broker(work / "run") as kafka:
            return _run(store, kafka, work, events)


@contextlib.contextmanager
def _s3(work: Path) -> Iterator[LocalS3]:
    store = LocalS3(LocalS3Settings(run_dir=work / "s3run", port=free_base_port(), bucket="bench"))
    store.start()
    saved = os.environ.copy()
    os.environ.update(store.environment())
    # The store's credentials for the settings built below, and LAKE_ROOT on S3 as for a
    # `ctr` command run against it.
    os.environ["LAKE_ROOT"] = "s3://bench/lake"
    try:
        yield store
    finally:
        os.environ.clear()
        os.environ.update(saved)
        store.stop()


def _run(store: LocalS3, kafka: KafkaSettings, work: Path, events: int) -> dict[str, object]:
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings

    config = TrafficConfig(
        seed=12, start_ms=int(HOUR.timestamp() * 1000), events_per_second=200.0,
        malformed_fraction=0.01,
    )  # fmt: skip
    print(f"bench storage: producing {events:,} events ...", flush=True)
    with EventProducer(kafka, ProducerSettings(), validate_records=False) as producer:
        produce(TrafficGenerator(config), producer, limit=events)
        producer.flush(120)
    lakes = {"local": str(work / "lake"), "s3": "s3://bench/lake"}
    # The S3 lake's store (its credentials set by _s3): the session gets the S3 connector.
    bucket = LakeSettings(lake_root=lakes["s3"]).object_store
    spark = spark_session(SparkSettings(master="local[2]", app_name="bench-storage"), bucket)
    figures: dict[str, dict[str, list[float]]] = {
        step: {side: [] for side in lakes}
        for step in ("archive", "batch", "first", "snapshot", "query")
    }
    for round_ in range(2):
        for side, root in lakes.items():
            lake = LakeSettings(
                lake_root=f"{root}-{round_}", checkpoint_root=work / f"ck-{side}-{round_}"
            )
            archive_s, batch_s = _archive_and_batch(spark, kafka, lake, events)
            first_s, snapshot_s, query_s = _serve(lake)
            figures["archive"][side].append(archive_s)
            figures["batch"][side].append(batch_s)
            figures["first"][side].append(first_s)
            figures["snapshot"][side].append(snapshot_s)
            figures["query"][side].append(query_s)
            print(
                f"bench storage: round {round_ + 1} {side:>5}: archive {archive_s:6.1f} s, "
                f"batch {batch_s:6.1f} s, first answer {first_s * 1000:7.0f} ms, "
                f"snapshot {snapshot_s * 1000:5.0f} ms, query {query_s * 1000:6.0f} ms",
                flush=True,
            )
    spark.stop()
    result: dict[str, object] = {"events": events}
    print(f"\nbench storage: {events:,} events, better of 2 runs each")
    print(f"{'step':<34}{'local':>12}{'S3':>12}{'S3 / local':>12}")
    names = {
        "archive": ("archive (s)", 1.0),
        "batch": ("batch, the events' hour (s)", 1.0),
        "first": ("serving: first answer (ms)", 1000.0),
        "snapshot": ("serving: a new snapshot (ms)", 1000.0),
        "query": ("serving: the query over it (ms)", 1000.0),
    }
    for step, (label, scale) in names.items():
        local, s3 = min(figures[step]["local"]), min(figures[step]["s3"])
        result[step] = {"local_s": local, "s3_s": s3, "ratio": s3 / local}
        print(f"{label:<34}{local * scale:>12,.1f}{s3 * scale:>12,.1f}{s3 / local:>12.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "storage.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _archive_and_batch(
    spark: SparkSession, kafka: KafkaSettings, lake: LakeSettings, events: int
) -> tuple[float, float]:
    from batch_layer.interval import Interval
    from batch_layer.job import BatchJob
    from master_dataset.archiver import run
    from master_dataset.settings import ArchiverSettings

    started = time.perf_counter()
    archived = run(spark, kafka=kafka, lake=lake, settings=ArchiverSettings(), available_now=True)
    archive_s = time.perf_counter() - started
    if archived != events:
        raise RuntimeError(f"archived {archived:,} of {events:,} records")
    started = time.perf_counter()
    BatchJob(spark, lake).run(Interval(HOUR, HOUR + dt.timedelta(hours=1)))
    return archive_s, time.perf_counter() - started


def _serve(lake: LakeSettings) -> tuple[float, float, float]:
    """The first answer's seconds, then the medians of a new snapshot (each table's log read
    again) and of the query over it."""
    from serving_layer.query import CtrQuery
    from serving_layer.reader import SnapshotReader
    from serving_layer.service import ServingLayer

    query = CtrQuery.create(
        start=HOUR - dt.timedelta(hours=12), end=HOUR + dt.timedelta(hours=12),
        granularity="hour", group_by=["campaign_id"],
    )  # fmt: skip
    started = time.perf_counter()
    serving = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        if not serving.ctr(query).rows:
            raise RuntimeError("the serving layer answered no rows")
        first = time.perf_counter() - started
        snapshots, queries = [], []
        for _ in range(QUERIES):
            started = time.perf_counter()
            snap = serving.reader.snapshot()
            snapshots.append(time.perf_counter() - started)
            started = time.perf_counter()
            serving.ctr(query, snap)
            queries.append(time.perf_counter() - started)
    finally:
        serving.close()
    return first, statistics.median(snapshots), statistics.median(queries)
