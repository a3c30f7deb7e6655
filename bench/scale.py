"""Scale benchmark: does the batch job scale out, and does its driver stay small?

The same batch job (``cli/submit.py`` under ``spark-submit``, the Airflow tasks' way) over one
day of events, on a local Spark standalone cluster of one worker of one core, then of two
workers of one core each; each at 1x and 4x the events (``--events``, default 1M: 1M and 4M).
Each run starts from an empty view (the batch tables removed), with a 1 GiB driver.

Per run it prints and records:
- the job's time (the application's start to its end in Spark's event log) and its throughput;
- the driver's CPU seconds (the driver JVM and its Python, from the OS: ``RUSAGE_CHILDREN`` of
  spark-submit);
- the bytes the tasks returned to the driver (the sum of every task's ``Result Size`` in the
  event log: collected rows, broadcast tables, the written files' descriptions), and per
  million events.

Goals (issue 48): two workers >= 1.6x one worker's throughput; <= 100 KB returned to the driver
per million events, flat from 1x to 4x. On a 2-core machine the two workers share the cores
with the driver: the speed-up is bounded by that.

The stream (issue 49): on the same clusters, the speed job (`ctr speed --available-now`, its
driver in its own process, the executors on the workers) drains a topic of ``--events`` events
on a broker of its own, from an empty checkpoint; per run its rate (the rows over the
micro-batches' durations, Spark's own figure) and the bytes its tasks returned to the driver
(the event log's ``Result Size``, the whole application). Goal: two workers >= 1.4x one (the
broker shares the cores too). ``BENCH_SCALE_PARTS=stream`` (or ``batch``) runs one half only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from bench.batch import DAY, _generate
from infra.broker import free_port, scratch_broker
from ingest.producer import EventProducer
from ingest.send_loop import produce
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from runtime.spark import submit_args
from runtime.spark_settings import SparkSettings

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = Path("bench/results")
DEFAULT_EVENTS = 1_000_000
SIZES = (1, 4)
WORKERS = (1, 2)
DRIVER_MEMORY = "1g"
EXECUTOR_MEMORY = "2g"


@dataclass(frozen=True)
class ScaleRun:
    workers: int
    events: int
    wall_seconds: float  # spark-submit, JVM start to exit
    job_seconds: float  # the application, start to end (event log)
    events_per_s: float
    driver_cpu_seconds: float
    result_bytes: int
    result_bytes_per_million: float
    tasks: int


def main(events: int | None = None) -> dict[str, object]:
    events = events or DEFAULT_EVENTS
    #: The halves to run, comma-separated: batch, stream; default both.
    parts = os.environ.get("BENCH_SCALE_PARTS", "batch,stream").split(",")
    with tempfile.TemporaryDirectory(prefix="ctr-bench-scale-") as scratch:
        base = Path(scratch)
        lakes = {}
        for size in SIZES if "batch" in parts else ():
            lake = LakeSettings(lake_root=base / f"lake-{size}x", checkpoint_root=base / "ck")
            print(f"bench scale: generating {size * events:,} events ({size}x) ...", flush=True)
            _generate(MASTER_EVENTS.path(lake), size * events)
            lakes[size] = lake
        runs: list[ScaleRun] = []
        streams: list[StreamRun] = []
        with contextlib.ExitStack() as stack:
            kafka = None
            if "stream" in parts:
                kafka = stack.enter_context(scratch_broker(base / "broker", topic="bench-scale"))
                _produce(kafka, events)
            for workers in WORKERS:
                with _Cluster(base / f"cluster-{workers}", workers) as master:
                    for size, lake in lakes.items():
                        shutil.rmtree(Path(lake.lake_root) / "batch", ignore_errors=True)
                        run = _submit(master, lake, base / "events", workers, size * events)
                        runs.append(run)
                        print(f"  {_line(run)}", flush=True)
                    if kafka is not None:
                        stream = _stream(master, kafka, base / f"stream-{workers}", workers)
                        streams.append(stream)
                        print(f"  stream: {_stream_line(stream)}", flush=True)
    return _report(runs, events, streams)


@dataclass(frozen=True)
class StreamRun:
    workers: int
    events: int
    batches: int
    events_per_s: float
    result_bytes: int
    result_bytes_per_million: float


_BATCH_LINE: Final = re.compile(r"batch (\d+): (\d+) rows, .* rows/s processed, (\d+) ms")


def micro_batches(log: Path) -> tuple[int, int, int]:
    """(rows, micro-batches, their milliseconds) of the batches with rows in a streaming job's
    log (its ``batch N: R rows, ..., D ms`` lines: Spark's own duration per batch)."""
    rows = ms = batches = 0
    for line in log.read_text(errors="replace").splitlines():
        match = _BATCH_LINE.search(line)
        if match and int(match.group(2)) > 0:
            batches += 1
            rows += int(match.group(2))
            ms += int(match.group(3))
    return rows, batches, ms


def _produce(kafka: KafkaSettings, events: int) -> None:
    print(f"bench scale: producing {events:,} events for the stream ...", flush=True)
    config = TrafficConfig(seed=17, start_ms=int(time.time() * 1000) - events // 5,
                           events_per_second=5_000)  # fmt: skip
    with EventProducer(kafka, ProducerSettings(), validate_records=False) as producer:
        produce(TrafficGenerator(config), producer, limit=events)


def _stream(master: str, kafka: KafkaSettings, folder: Path, workers: int) -> StreamRun:
    """The speed job over the whole topic, from an empty checkpoint, on ``master``."""
    logs = folder / "spark-events"
    logs.mkdir(parents=True)
    spark_conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(logs),
                  "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
                  "spark.executor.memory": EXECUTOR_MEMORY}  # fmt: skip
    env = {
        **os.environ,
        **kafka.environ(),
        "KAFKA_TOPIC": kafka.topic,
        "LAKE_ROOT": str(folder / "lake"),
        "CHECKPOINT_ROOT": str(folder / "checkpoints"),
        "SPARK_MASTER": master,
        "SPARK_CONF": json.dumps(spark_conf),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(ROOT),
    }
    log = folder / "speed.log"
    with log.open("w") as out:
        done = subprocess.run([str(BIN / "ctr"), "speed", "--available-now"], env=env,
                              stdout=out, stderr=subprocess.STDOUT, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the speed job failed: see the end of\n{log.read_text()[-4000:]}")
    rows, batches, ms = micro_batches(log)
    _, result_bytes, _, _ = event_log(logs)
    return StreamRun(
        workers=workers,
        events=rows,
        batches=batches,
        events_per_s=round(rows / (ms / 1000)) if ms else 0.0,
        result_bytes=result_bytes,
        result_bytes_per_million=round(result_bytes / (rows / 1e6)) if rows else 0.0,
    )


def _stream_line(run: StreamRun) -> str:
    return (
        f"{run.workers} worker(s), {run.events:>10,} events in {run.batches} micro-batches: "
        f"{run.events_per_s:>9,.0f} events/s, returned to the driver "
        f"{run.result_bytes / 1024:,.0f} KiB ({run.result_bytes_per_million / 1024:,.1f} KiB per "
        "million events)"
    )


def _line(run: ScaleRun) -> str:
    kib = run.result_bytes / 1024
    return (
        f"{run.workers} worker(s), {run.events:>10,} events: job {run.job_seconds:6.1f} s "
        f"({run.events_per_s:>9,.0f} events/s), driver CPU {run.driver_cpu_seconds:5.1f} s, "
        f"returned to the driver {kib:,.0f} KiB "
        f"({run.result_bytes_per_million / 1024:,.1f} KiB per million events, {run.tasks:,} tasks)"
    )


def _report(runs: list[ScaleRun], events: int, streams: list[StreamRun]) -> dict[str, object]:
    outcome: dict[str, object] = {
        "benchmark": "scale",
        "events": events,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    if streams:
        one, two = (next(r for r in streams if r.workers == w) for w in WORKERS)
        speedup = round(two.events_per_s / one.events_per_s, 2) if one.events_per_s else None
        outcome["stream"] = {
            "runs": [asdict(r) for r in streams],
            "two_workers_speedup": speedup,
            "result_kib_per_million_max": round(
                max(r.result_bytes_per_million for r in streams) / 1024, 1
            ),
            "goal": "2 workers >= 1.4x; <= 100 KB per million events",
        }
        print(f"bench scale: the stream, two workers over one: x{speedup} (goal >= 1.4)")
    if runs:
        outcome |= _batch_report(runs, events)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(outcome, indent=2) + "\n")
    return outcome


def _batch_report(runs: list[ScaleRun], events: int) -> dict[str, object]:
    def find(workers: int, size: int) -> ScaleRun:
        return next(r for r in runs if r.workers == workers and r.events == size * events)

    speedups = {
        f"{size}x": round(find(2, size).events_per_s / find(1, size).events_per_s, 2)
        for size in SIZES
    }
    per_million = [r.result_bytes_per_million for r in runs]
    outcome: dict[str, object] = {
        "runs": [asdict(r) for r in runs],
        "two_workers_speedup": speedups,
        "result_kib_per_million_max": round(max(per_million) / 1024, 1),
        "goal": "2 workers >= 1.6x; <= 100 KB per million events, flat 1x-4x",
    }
    print(
        "bench scale: two workers over one: "
        + ", ".join(f"x{v:.2f} at {k}" for k, v in speedups.items())
        + " (goal >= 1.6); returned to the driver at most "
        f"{max(per_million) / 1024:,.1f} KiB per million events (goal <= 100 KB, flat): "
        + ", ".join(
            f"{r.workers}w {r.events / 1e6:g}M {r.result_bytes_per_million / 1024:,.1f}"
            for r in runs
        )
    )
    return outcome


def _submit(master: str, lake: LakeSettings, logs: Path, workers: int, events: int) -> ScaleRun:
    """One measured run of the batch job over the day, under spark-submit on ``master``."""
    logs = logs / f"{workers}w-{events}"
    logs.mkdir(parents=True)
    env = {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(ROOT),
    }
    command = [str(BIN / "spark-submit"), *submit_args(SparkSettings(), lake.object_store)]
    command += ["--master", master]
    command += ["--driver-memory", DRIVER_MEMORY, "--executor-memory", EXECUTOR_MEMORY]
    command += ["--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={logs}"]
    # One plain JSON file (Spark 4 rolls and compresses event logs by default).
    command += ["--conf", "spark.eventLog.rolling.enabled=false"]
    command += ["--conf", "spark.eventLog.compress=false"]
    command += [str(ROOT / "cli" / "submit.py"), "--run-id", f"scale-{workers}w-{events}"]
    command += ["--start", DAY.isoformat(), "--end", (DAY + dt.timedelta(days=1)).isoformat()]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the batch job failed:\n{(done.stdout + done.stderr)[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    job_ms, result_bytes, tasks, stages = event_log(logs)
    seconds = job_ms / 1000
    _where_time_goes(stages, seconds)
    return ScaleRun(
        workers=workers,
        events=events,
        wall_seconds=round(wall, 2),
        job_seconds=round(seconds, 2),
        events_per_s=round(events / seconds),
        driver_cpu_seconds=round(cpu, 2),
        result_bytes=result_bytes,
        result_bytes_per_million=round(result_bytes / (events / 1e6)),
        tasks=tasks,
    )


@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    tasks: int = 0
    result_bytes: int = 0
    executor_seconds: float = 0.0


def event_log(folder: Path) -> tuple[int, int, int, list[Stage]]:
    """(the application's milliseconds, bytes of task results, tasks, its stages) from its
    event log."""
    (log,) = [p for p in folder.iterdir() if p.is_file()]
    start = end = result = tasks = 0
    stages: dict[tuple[int, int], Stage] = {}
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerApplicationStart":
                start = event["Timestamp"]
            elif kind == "SparkListenerApplicationEnd":
                end = event["Timestamp"]
            elif kind == "SparkListenerTaskEnd":
                tasks += 1
                metrics = event.get("Task Metrics") or {}
                key = (event["Stage ID"], event["Stage Attempt ID"])
                stage = stages.setdefault(key, Stage(""))
                stage.tasks += 1
                stage.result_bytes += metrics.get("Result Size", 0)
                stage.executor_seconds += metrics.get("Executor Run Time", 0) / 1000
                result += metrics.get("Result Size", 0)
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                stage = stages.setdefault((info["Stage ID"], info["Stage Attempt ID"]), Stage(""))
                stage.name = info["Stage Name"]
                if info.get("Submission Time") and info.get("Completion Time"):
                    stage.seconds = (info["Completion Time"] - info["Submission Time"]) / 1000
    return end - start, result, tasks, list(stages.values())


def _where_time_goes(stages: list[Stage], job_seconds: float) -> None:
    """The stages that took longest, and the rest of the job (the driver's own work between
    them: planning, the Delta log, the commit, coverage, drift)."""
    in_stages = sum(s.seconds for s in stages)
    print(f"    {len(stages)} stages, {in_stages:.1f} s of {job_seconds:.1f} s (stages overlap "
          "rarely here); the longest:")  # fmt: skip
    for stage in sorted(stages, key=lambda s: -s.seconds)[:6]:
        print(
            f"    {stage.seconds:6.1f} s  {stage.tasks:4d} tasks, {stage.executor_seconds:6.1f} s "
            f"in tasks, {stage.result_bytes / 1024:7.1f} KiB to the driver  {stage.name}"
        )


class _Cluster:
    """A standalone master and ``workers`` workers of one core each, on loopback."""

    def __init__(self, folder: Path, workers: int) -> None:
        self.folder, self.workers = folder, workers
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> str:
        self.folder.mkdir(parents=True)
        port = free_port()
        url = f"spark://127.0.0.1:{port}"
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
               "PYSPARK_PYTHON": sys.executable}  # fmt: skip
        master_log = self.folder / "master.log"
        self._start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                     str(port), "--webui-port", str(free_port())], master_log, env)  # fmt: skip
        for n in range(self.workers):
            work = self.folder / f"work-{n}"
            work.mkdir()
            log = self.folder / f"worker-{n}.log"
            self._start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                         "--cores", "1", "--memory", "3g", "--webui-port", str(free_port()),
                         "--work-dir", str(work)], log, env)  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = master_log.read_text() if master_log.exists() else ""
            if text.count("Registering worker") >= self.workers:
                return url
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"the workers did not register: see {self.folder}")

    def _start(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen([str(BIN / "spark-class"), *args], stdout=out,
                                 stderr=subprocess.STDOUT, env=env, start_new_session=True)
            )  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        for process in reversed(self.processes):
            try:
                os.killpg(process.pid, 15)
            except ProcessLookupError:
                continue
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
