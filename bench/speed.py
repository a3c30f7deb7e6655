"""Speed-layer freshness, produce -> visible in speed/ctr and through the HTTP API, at steady rates.

`ctr speed` runs as its own process (default settings: 1 s trigger, local[2]) on a broker of
its own, and `ctr serve` beside it over the same lake. Every 250 ms one *probe* event with a
unique ``ad_id`` goes out with the traffic (event time "now"). A probe is

- *committed* when the first Delta commit whose added files hold its row lands (that commit's
  timestamp minus the probe's send time, same machine clock), and
- *served* when ``GET /api/v1/ctr?campaign_id=probe&group_by=ad_id`` first returns it: what a
  dashboard sees (polled every 100 ms, so up to ~0.1 s of the figure is the poll interval).

Phases: 2,000 events/s for 20 s (live-sized micro-batches of ~2,000 records at a 1 s trigger),
5,000 events/s for 60 s (the freshness goal), then steps of higher rates (20 s each) find the
highest rate at which the job keeps up (offsets behind stay bounded). The job logs where each
micro-batch's time goes (Spark's trigger phases, then its own: the view's Spark job, each
write): the benchmark prints the median per phase. Last, in the benchmark's own SparkSession,
the view's Spark job is taken apart on 2,000 records: Kafka read, + parsing, + the view.

Modules: :mod:`bench.speed_traffic` (the phases, the probes, the job's progress),
:mod:`bench.speed_api` (the API watcher), :mod:`bench.speed_figures` (what the run left),
:mod:`bench.speed_view` (the view's breakdown), :mod:`bench.speed_report` (the results).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.speed_api import ApiWatcher, wait_for_api
from bench.speed_figures import backlog_figures, restart_attribution, table_files, visibility
from bench.speed_report import report
from bench.speed_traffic import (
    LIVE_RATE,
    LIVE_SECONDS,
    MAIN_RATE,
    MAIN_SECONDS,
    RECORDER,
    STEP_RATES,
    STEP_SECONDS,
    Phase,
    drain,
    produce_phase,
    send,
    status_batch,
    wait_for_status,
)
from bench.speed_view import view_breakdown
from infra.broker import free_port, scratch_broker
from ingest.producer import EventProducer
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.settings import LakeSettings
from lake.speed_status import speed_status_path
from runtime.kafka_settings import KafkaSettings
from runtime.topics import ensure_topics

CTR = str(Path(sys.executable).with_name("ctr"))
BACKLOG_EVENTS = 1_000_000  # after a stop: the backlog the restarted job drains


@dataclass(frozen=True)
class SpeedBenchSettings:
    """What the speed benchmark takes from its environment, read once at its start."""

    kafka: KafkaSettings  # a cluster elsewhere is used as is; on loopback, a broker of its own
    environ: Mapping[str, str]  # the job's and the API's, before the run's settings


def main(events: int | None = None) -> dict[str, object]:
    del events  # rate and duration define this benchmark
    settings = SpeedBenchSettings(kafka=KafkaSettings(), environ=dict(os.environ))
    with tempfile.TemporaryDirectory(prefix="ctr-bench-speed-") as scratch:
        work = Path(scratch)
        if not settings.kafka.is_loopback:
            return _run(settings.kafka, work, settings.environ)
        with scratch_broker(work / "run", topic="bench-speed") as local:
            return _run(local, work, settings.environ)


def _run(kafka: KafkaSettings, work: Path, environ: Mapping[str, str]) -> dict[str, object]:
    ensure_topics(kafka)
    lake = LakeSettings(lake_root=work / "lake", checkpoint_root=work / "checkpoints")
    token, port = secrets.token_urlsafe(24), free_port()
    env = {
        **environ,
        **kafka.environ(),  # the cluster and its credentials, if it requires a login
        "KAFKA_TOPIC": kafka.topic,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "SPEED_MAINTENANCE_SECONDS": "3600",  # keep every file for the post-run scan
        "API_TOKEN": token,
    }
    log = (work / "speed.log").open("w")
    api_log = (work / "api.log").open("w")
    job = subprocess.Popen([CTR, "speed"], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)  # fmt: skip
    api = subprocess.Popen([CTR, "serve", "--port", str(port)], env=env, stdout=api_log,
                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    watcher = ApiWatcher(f"http://127.0.0.1:{port}", token, int(time.time() * 1000))
    try:
        generator = TrafficGenerator(
            TrafficConfig(seed=11, start_ms=int(time.time() * 1000), events_per_second=MAIN_RATE)
        )
        with EventProducer(kafka, ProducerSettings()) as producer:
            print("bench speed: warming up (job start + 15 s of traffic) ...", flush=True)
            warmup = Phase(MAIN_RATE, 15.0)
            wait_for_status(lake, job, producer, generator)
            wait_for_api(port, api)
            watcher.start()
            produce_phase(warmup, producer, generator, lake, "warmup")
            drain(lake, job)
            phases = [Phase(LIVE_RATE, LIVE_SECONDS), Phase(MAIN_RATE, MAIN_SECONDS)]
            phases += [Phase(rate, STEP_SECONDS) for rate in STEP_RATES]
            for number, phase in enumerate(phases):
                print(f"bench speed: {phase.rate:,} events/s for {phase.seconds:.0f} s ...",
                      flush=True)  # fmt: skip
                first = status_batch(lake) + 1
                RECORDER.on = number == len(phases) - 1  # the last minutes before the stop
                produce_phase(phase, producer, generator, lake, f"p{number}")
                drain(lake, job)
                time.sleep(1.0)  # the API's snapshot refresh
                phase.batches = (first, status_batch(lake))
            visible = visibility(lake.table("speed/ctr"))
            watcher.stop()
            _stop(job)
            stopped_ms = RECORDER.last_ms
            # The backlog: produced while the job is down, then drained by a restarted job
            # (whose event log counts the bytes its tasks return to the driver).
            print(f"bench speed: job stopped; producing a backlog of {BACKLOG_EVENTS:,} events "
                  "...", flush=True)  # fmt: skip
            for _ in range(BACKLOG_EVENTS // 10_000):
                send(producer, generator, 10_000)
                producer.poll(0)
            producer.flush()
        # The stopped job's last report says it had caught up: without it, drain() waits for
        # the restarted job's own reports (its start can outlast the settle time).
        Path(speed_status_path(lake)).unlink(missing_ok=True)  # a local lake
        job = _restart(env, work)
        drain(lake, job, timeout_s=900, settle_s=30)
        backlog = backlog_figures(work / "speed-backlog.log", work / "spark-events")
        backlog["restart"] = restart_attribution(lake, stopped_ms)
    finally:
        watcher.stop()
        for process in (job, api):
            _stop(process)
        log.close()
        api_log.close()
    files = table_files(lake.table("speed/ctr"))
    breakdown = view_breakdown(kafka, work)
    return report(phases, visible, watcher, work, files, breakdown, backlog)


def _restart(env: dict[str, str], work: Path) -> subprocess.Popen[bytes]:
    """The job again, its Spark event log under ``work/spark-events``."""
    print("bench speed: restarting the job on the backlog ...", flush=True)
    events_log = work / "spark-events"
    events_log.mkdir()
    spark_conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events_log),
                  "spark.eventLog.compress": "false",
                  "spark.eventLog.rolling.enabled": "false"}  # fmt: skip
    log = (work / "speed-backlog.log").open("w")
    return subprocess.Popen([CTR, "speed"], env={**env, "SPARK_CONF": json.dumps(spark_conf)},
                            stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
