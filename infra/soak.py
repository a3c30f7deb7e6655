"""`make soak`: the whole platform as `make demo` runs it, under steady traffic for a long run,
sampled every minute, judged by :mod:`infra.soak_report`'s rules; with ``CHAOS=1`` a component
is SIGKILLed every few minutes and the project's own supervision must bring it back; at the
end the traffic stops, everything drains, and the exact views are checked against what the
producer delivered.

Settings (environment): ``SOAK_MINUTES`` (60), ``SOAK_RATE`` (1000 events/s), ``CHAOS`` (0|1),
``SOAK_SAMPLE_S`` (60), ``SOAK_KILL_EVERY_S`` (240), ``SOAK_SEED``, ``RUN_DIR``. The demo's own
settings (``DEMO_BATCH_MINUTES``, ``API_PORT``, …) pass through. State lives under
``RUN_DIR/soak/demo`` (a fresh lake and broker per soak), the report under ``RUN_DIR/soak``:
``report.md``, ``samples.csv``, ``kills.csv``, ``requests.csv``, one PNG per group of series.

What supervises what in the demo (``CHAOS=1`` kills each):

- Kafka brokers (3-broker profile under chaos, in network namespaces when run as root, so that
  one can also be cut off for ``PARTITION_S`` and healed): the broker watch
  (``infra/broker_watch.py``);
- the archiver, the speed job, the API: ``infra/supervise.sh``, a restart loop;
- a running batch task (``ctr_batch``'s spark-submit): Airflow's task retries;
- Airflow's scheduler: ``infra/airflow-up.sh``'s component loop.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from infra import soak_report
from infra.broker import is_alive, read_pid

ROOT: Final = Path(__file__).resolve().parent.parent
PAGE: Final = os.sysconf("SC_PAGE_SIZE")
TICKS: Final = os.sysconf("SC_CLK_TCK")
# The fixed query whose p99 the soak judges: the country breakdown of the last WINDOW_MINUTES
# by minute (the same amount of data all along). The dashboard's default, the last day, is
# sampled too but reads all the data a soak shorter than a day has made: reported, not judged.
WINDOW_MINUTES: Final = 15
DASHBOARD_QUERY: Final = "/api/v1/ctr?granularity=hour&group_by=country&order_by=-impressions"
PROBES_PER_SAMPLE: Final = 40
DASHBOARD_PROBES_PER_SAMPLE: Final = 10
# A sample's p99 is over the probes of the last P99_SAMPLES samples (200 requests of the fixed
# query): a p99 of one sample's 40 is their maximum, the one request of the minute that misses
# the API's response cache (a new minute is a new URL), and swings by 300 ms minute to minute.
P99_SAMPLES: Final = 5
# Shorter runs report their series without judging them: a second half shorter than the
# retention windows plus a maintenance period (15 + 15 min, scaled) shows warm-up, not a trend.
JUDGED_FROM_MINUTES: Final = 40
PARTITION_S: Final = 20.0  # how long a chaos round cuts a broker off
# The demo components whose process groups are sampled (their pid files under the demo dir).
COMPONENTS: Final = ("producer", "archiver", "speed", "api", "airflow", "broker-watch")
# Tables whose bytes grow with the data by design (the master dataset, the exact views).
DATA_TABLES: Final = ("master/events", "master/rejected", "batch/ctr")


@dataclass
class Config:
    minutes: float
    rate: int
    chaos: bool
    sample_s: float
    kill_every_s: float
    seed: int
    run_dir: Path

    @property
    def out(self) -> Path:
        return self.run_dir / "soak"

    @property
    def demo(self) -> Path:
        return self.out / "demo"

    def scaled_windows(self) -> dict[str, str]:
        """Retention windows shrunk to fit the soak, so that each turns over within its first
        half and the second half shows whether the clean-up holds the series flat (in
        production the same mechanisms hold them at the full windows). The environment's
        own values win."""
        mib = 2**20
        defaults = {
            "LAKE_LOG_RETENTION_HOURS": "0.25",
            "LAKE_HISTORY_RETENTION_HOURS": "0.25",
            "LAKE_VACUUM_RETENTION_HOURS": "0.25",
            "SPEED_VACUUM_RETENTION_HOURS": "0.25",
            "DEMO_MAINTENANCE_MINUTES": "15",
            "ARCHIVER_MAINTENANCE_SECONDS": "300",
            "KAFKA_TOPIC_CONFIG": json.dumps(
                {"retention.bytes": str(16 * mib), "segment.bytes": str(4 * mib)}
            ),
        }
        return {k: os.environ.get(k) or v for k, v in defaults.items()}

    @property
    def brokers(self) -> int:
        return 3 if self.chaos else 1

    @property
    def netns(self) -> bool:
        """Under chaos, the brokers in network namespaces (so one can be cut off), if this
        machine allows it (root, iproute2)."""
        import shutil

        return self.chaos and os.geteuid() == 0 and shutil.which("ip") is not None

    @classmethod
    def from_env(cls) -> Config:
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name, "") or str(default)
            try:
                value = float(raw)
            except ValueError:
                raise SystemExit(f"soak: error: {name} must be a number, got {raw!r}") from None
            if value <= 0:
                raise SystemExit(f"soak: error: {name} must be above 0, got {raw!r}")
            return value

        chaos = os.environ.get("CHAOS", "0") or "0"
        if chaos not in ("0", "1"):
            raise SystemExit(f"soak: error: CHAOS must be 0 or 1, got {chaos!r}")
        return cls(
            minutes=number("SOAK_MINUTES", 60),
            rate=int(number("SOAK_RATE", 1000)),
            chaos=chaos == "1",
            sample_s=number("SOAK_SAMPLE_S", 60),
            kill_every_s=number("SOAK_KILL_EVERY_S", 240),
            seed=int(os.environ.get("SOAK_SEED", "") or time.time()),
            run_dir=Path(os.environ.get("RUN_DIR", "run")).resolve(),
        )


def log(message: str) -> None:
    print(f"soak: {dt.datetime.now(dt.UTC):%H:%M:%S} {message}", flush=True)


# --- processes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    ticks: int  # utime + stime
    rss: int  # bytes
    vsize: int = 0  # bytes of address space


def own_memory(members: Iterable[int], procs: dict[int, Proc]) -> int:
    """Resident bytes of ``members``, each address space counted once: a child with its
    parent's address space size is a copy of the parent not yet replaced by an exec (a JVM
    spawning a command shares the JVM's memory until then, and its RSS reads as the whole
    JVM's; a forked copy shares its pages too). Counting those twice put single samples of
    the speed job 600 MB above the rest in two soaks."""
    total = 0
    for pid in members:
        proc = procs.get(pid)
        if proc is None:
            continue
        parent = procs.get(proc.ppid)
        if parent is not None and proc.vsize and proc.vsize == parent.vsize:
            continue
        total += proc.rss
    return total


def processes() -> dict[int, Proc]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        # state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        # (vsize and rss: fields 23 and 24 of proc(5), here 20 and 21)
        found[int(entry.name)] = Proc(
            int(entry.name),
            int(fields[1]),
            int(fields[2]),
            int(fields[11]) + int(fields[12]),
            int(fields[21]) * PAGE,
            int(fields[20]),
        )
    return found


def descendants(pid: int, procs: dict[int, Proc]) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int | None) -> bool:
    return pid is not None and is_alive(pid)


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process under it (a Spark driver's JVM with its Python)."""
    doomed = descendants(pid, processes())
    for member in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    return doomed


# --- the demo --------------------------------------------------------------------------------


class Demo:
    """The soak's `make demo`: its processes, lake, checkpoints and broker."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.dir = config.demo
        self.env = dict(os.environ)

    def start(self, ground_truth: Path) -> None:
        env = {
            **os.environ,
            "RUN_DIR": str(self.config.out),
            "DEMO_RATE": str(self.config.rate),
            "DEMO_BROKERS": str(self.config.brokers),
            "DEMO_NETNS": "1" if self.config.netns else "0",
            "DEMO_GROUND_TRUTH": str(ground_truth),
            **self.config.scaled_windows(),
        }
        for name in ("LAKE_ROOT", "CHECKPOINT_ROOT", "KAFKA_BOOTSTRAP_SERVERS", "API_TOKEN"):
            env.pop(name, None)
        log(f"starting the platform (make demo at {self.config.rate:,} events/s)")
        subprocess.run(["bash", "infra/demo.sh"], cwd=ROOT, env=env, check=True)
        self.env = {**os.environ, **self._demo_env()}

    def _demo_env(self) -> dict[str, str]:
        """The settings demo.sh wrote to its env file (``export A="x" B="y"`` lines)."""
        script = f"set -a; source {self.dir / 'env'}; env -0"
        out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
        pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
        return {k: v for k, v in pairs}

    def down(self) -> None:
        env = {**self.env, "RUN_DIR": str(self.config.out)}
        subprocess.run(["bash", "infra/demo-down.sh"], cwd=ROOT, env=env, check=False)

    def running(self) -> bool:
        return (self.dir / "run-id").exists()

    # paths and pids
    def pid(self, name: str) -> int | None:
        return read_pid(self.dir / f"{name}.pid")

    def child(self, name: str) -> int | None:
        return read_pid(self.dir / f"{name}.child.pid")

    @property
    def lake(self) -> Path:
        return Path(self.env.get("LAKE_ROOT", self.dir / "lake"))

    @property
    def checkpoints(self) -> Path:
        return Path(self.env.get("CHECKPOINT_ROOT", self.dir / "checkpoints"))

    def broker_pids(self) -> dict[int, int | None]:
        nodes = sorted((self.dir / "kafka").glob("node-*"))
        return {int(n.name.split("-")[1]): read_pid(n / "kafka.pid") for n in nodes}

    def api(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        port = self.env.get("API_PORT", "8000")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            headers={"Authorization": f"Bearer {self.env.get('API_TOKEN', '')}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (OSError, TimeoutError):
            return 0, b""  # no answer (refused, reset, timed out)

    def lags(self) -> dict[str, int | None]:
        from infra.demo_drain import behind
        from runtime.kafka_settings import KafkaSettings
        from runtime.offsets import topic_offsets
        from runtime.streaming import committed_offsets

        kafka = KafkaSettings.from_environ(self.env)  # the demo's broker and its credentials
        try:
            ends = {o.partition: o.latest for o in topic_offsets(kafka, kafka.topic, timeout_s=5)}
        except Exception:  # the broker between a kill and its restart
            return {"archiver": None, "speed": None}
        return {
            job: behind(ends, committed_offsets(self.checkpoints / job, kafka.topic))
            for job in ("archiver", "speed")
        }


# --- sampling --------------------------------------------------------------------------------


@dataclass
class Sampler:
    demo: Demo
    started: float
    rows: list[tuple[float, str, float]] = field(default_factory=list)
    requests: list[tuple[float, int, float]] = field(default_factory=list)  # t, status, ms
    _p99: dict[str, RecentP99] = field(default_factory=dict)  # per latency series
    _ticks: dict[int, int] = field(default_factory=dict)
    _at: float = 0.0

    def t(self) -> float:
        return time.time() - self.started

    def add(self, series: str, value: float | None) -> None:
        if value is not None:
            self.rows.append((round(self.t(), 1), series, float(value)))

    def sample(self) -> None:
        self._processes()
        self._tables()
        self._checkpoints()
        self._kafka()
        for job, lag in self.demo.lags().items():
            self.add(f"lag_records.{job}", lag)
        self._api()

    def _processes(self) -> None:
        procs = processes()
        now = time.monotonic()
        groups: dict[str, int] = {}
        for name in COMPONENTS:
            pid = self.demo.pid(name)
            if pid is not None:
                groups[name] = pid
        for node, pid in self.demo.broker_pids().items():
            if pid is not None and _alive(pid):
                groups[f"kafka-{node}"] = pid
        elapsed = now - self._at if self._at else 0.0
        ticks_now = {p.pid: p.ticks for p in procs.values()}
        for name, leader in groups.items():
            if name.startswith("kafka-"):
                members = [leader]
            else:
                members = [p.pid for p in procs.values() if p.pgid == leader]
            self.add(f"rss_mb.{name}", own_memory(members, procs) / 2**20)
            if elapsed:
                used = sum(ticks_now[m] - self._ticks.get(m, 0) for m in members if m in procs)
                self.add(f"cpu_pct.{name}", 100 * used / TICKS / elapsed)
        self._ticks, self._at = ticks_now, now

    def _tables(self) -> None:
        from deltalake import DeltaTable

        for log_dir in sorted(self.demo.lake.glob("**/_delta_log")):
            table = log_dir.parent
            name = str(table.relative_to(self.demo.lake))
            files = [
                p
                for p in table.rglob("*.parquet")
                if "_delta_log" not in p.parts and not p.name.startswith(".")
            ]
            size = sum(_size(p) for p in files) / 2**20
            data = name.startswith(DATA_TABLES)
            self.add(f"{'data_mb' if data else 'table_mb'}.{name}", size)
            if not data:
                self.add(f"table_files.{name}", len(files))
            entries = list(log_dir.iterdir())
            self.add(f"delta_log.{name}", sum(p.suffix == ".json" for p in entries))
            self.add(f"delta_checkpoints.{name}", sum(".checkpoint" in p.name for p in entries))
            with contextlib.suppress(Exception):  # a commit in flight: the next sample has it
                self.add(f"active_files.{name}", len(DeltaTable(str(table)).file_uris()))

    def _checkpoints(self) -> None:
        root = self.demo.checkpoints
        if not root.is_dir():
            return
        for job in sorted(p for p in root.iterdir() if p.is_dir()):
            files = [p for p in job.rglob("*") if p.is_file()]
            self.add(f"checkpoint_files.{job.name}", len(files))
            self.add(f"checkpoint_mb.{job.name}", sum(_size(p) for p in files) / 2**20)

    def _kafka(self) -> None:
        for node in sorted((self.demo.dir / "kafka").glob("node-*")):
            files = [p for p in (node / "data").rglob("*") if p.is_file()]
            self.add(f"kafka_mb.{node.name}", sum(_size(p) for p in files) / 2**20)

    def _api(self) -> None:
        status, body = self.demo.api("/api/v1/views")
        if status == 200:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                updated = json.loads(body)["freshness"]["speed_updated_at"]
                at = dt.datetime.fromisoformat(str(updated).replace("Z", "+00:00"))
                self.add("freshness_s.speed", time.time() - at.timestamp())
        self._probe(
            "api_p99_ms.fixed_query", window_query(dt.datetime.now(dt.UTC)), PROBES_PER_SAMPLE
        )
        self._probe("api_day_p99_ms.dashboard", DASHBOARD_QUERY, DASHBOARD_PROBES_PER_SAMPLE)

    def _probe(self, series: str, query: str, probes: int) -> None:
        """Ask ``query`` ``probes`` times; every answer goes to ``requests``, to ``series`` the
        p99 of the successful ones of this sample and the ``P99_SAMPLES - 1`` before it."""
        latencies = []
        for _ in range(probes):
            began = time.perf_counter()
            status, _ = self.demo.api(query)
            ms = (time.perf_counter() - began) * 1000
            self.requests.append((round(self.t(), 1), status, round(ms, 1)))
            if status == 200:
                latencies.append(ms)
        self.add(series, self._p99.setdefault(series, RecentP99()).add(latencies))


class RecentP99:
    """The p99 of the latencies of the last ``samples`` samples together."""

    def __init__(self, samples: int = P99_SAMPLES) -> None:
        self._recent: deque[list[float]] = deque(maxlen=samples)

    def add(self, latencies: list[float]) -> float | None:
        """Take one sample's latencies; the p99 of the recent ones (the value 99 % of them are
        at most; of 100 or fewer, their maximum), None while there are none."""
        self._recent.append(latencies)
        ordered = sorted(ms for sample in self._recent for ms in sample)
        if not ordered:
            return None
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def window_query(now: dt.datetime) -> str:
    """The judged fixed query at ``now``: the last :data:`WINDOW_MINUTES` whole minutes (the
    same URL for a whole minute, so its probes share the API's response cache as a dashboard's
    refreshes do)."""
    start = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=WINDOW_MINUTES)
    return (
        f"/api/v1/ctr?start={start:%Y-%m-%dT%H:%M:%SZ}&granularity=minute"
        "&group_by=country&order_by=-impressions"
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --- chaos -----------------------------------------------------------------------------------


@dataclass
class Kill:
    t: float
    target: str
    detail: str
    back_s: float | None = None  # the component running again
    normal_s: float | None = None  # archiver's and speed job's lag back to normal


class Chaos:
    """Every ``kill_every_s``, SIGKILL one component at random, then time its recovery."""

    def __init__(self, demo: Demo, sampler: Sampler, config: Config) -> None:
        self.demo, self.sampler, self.config = demo, sampler, config
        self.random = random.Random(config.seed)
        self.kills: list[Kill] = []
        self.targets: dict[str, Callable[[], tuple[str, Callable[[], bool]] | None]] = {
            "archiver": lambda: self._supervised("archiver"),
            "speed": lambda: self._supervised("speed"),
            "api": lambda: self._supervised("api"),
            "broker": self._broker,
            "partition": self._partition,
            "batch-task": self._batch_task,
            "scheduler": self._scheduler,
        }
        self._threads: list[threading.Thread] = []
        self._order: list[str] = []  # this round's targets not killed yet, next last

    def strike(self) -> None:
        """Kill the next target of this round that has something to kill now (a batch task
        only while one runs: it stays first in line until then); a round is every target
        once, in a random order."""
        for _ in range(2):
            for target in reversed(self._order):
                result = self.targets[target]()
                if result is None:
                    continue
                self._order.remove(target)
                detail, is_back = result
                kill = Kill(self.sampler.t(), target, detail)
                self.kills.append(kill)
                verb = "cut off" if target == "partition" else "SIGKILL"
                log(f"chaos: {verb} {target} ({detail})")
                thread = threading.Thread(target=self._recover, args=(kill, is_back), daemon=True)
                thread.start()
                self._threads.append(thread)
                return
            fresh = [t for t in self.targets if t not in self._order]
            self.random.shuffle(fresh)
            self._order = fresh + self._order  # what waits (a batch task) stays first in line
        log("chaos: nothing to kill now")

    def _recover(self, kill: Kill, is_back: Callable[[], bool], timeout_s: float = 900) -> None:
        """Time the component running again (``back_s``) and the streaming jobs' lags back to
        normal (``normal_s``: for the archiver, the speed job, the API and a broker, not
        before the component is back; a batch task or the scheduler does not hold the lags)."""
        began = time.monotonic()
        normal = {"archiver": self.config.rate * 25, "speed": self.config.rate * 5}
        waits_for_back = kill.target in ("archiver", "speed", "api", "broker", "partition")
        while time.monotonic() - began < timeout_s:
            now = round(time.monotonic() - began, 1)
            if kill.back_s is None and is_back():
                kill.back_s = now
            if kill.normal_s is None and (kill.back_s is not None or not waits_for_back):
                lags = self.demo.lags()
                if all((lags[j] or 0) <= normal[j] and lags[j] is not None for j in normal):
                    kill.normal_s = now
            if kill.back_s is not None and kill.normal_s is not None:
                log(
                    f"chaos: {kill.target} back after {kill.back_s} s, lags normal after "
                    f"{kill.normal_s} s"
                )
                return
            time.sleep(1)
        log(f"chaos: {kill.target} not recovered within {timeout_s:.0f} s")

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _supervised(self, name: str) -> tuple[str, Callable[[], bool]] | None:
        pid = self.demo.child(name)
        if not _alive(pid):
            return None
        assert pid is not None
        doomed = kill_tree(pid)

        killed_at = time.time()

        def back() -> bool:
            new = self.demo.child(name)
            if new is None or new == pid or not _alive(new):
                return False
            if name == "api":
                return self.demo.api("/healthz", timeout=2)[0] == 200
            # a streaming job is back once it has committed a micro-batch again
            return _last_commit_at(self.demo.checkpoints / name) > killed_at

        return f"pid {pid} and {len(doomed) - 1} below it", back

    def _broker(self) -> tuple[str, Callable[[], bool]] | None:
        nodes = {n: p for n, p in self.demo.broker_pids().items() if n != 0 and _alive(p)}
        if len(nodes) < 2:  # one broker: killing it is an outage, not a failover
            return None
        node = self.random.choice(sorted(nodes))
        pid = nodes[node]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        def back() -> bool:
            new = self.demo.broker_pids().get(node)
            return new is not None and new != pid and _alive(new)

        return f"broker node {node}, pid {pid}", back

    def _partition(self) -> tuple[str, Callable[[], bool]] | None:
        """Cut a broker off (its namespace's link down) for ``PARTITION_S``, then heal it; it
        is back once it is in the in-sync replicas of every partition of the event topic."""
        from infra.broker import Layout

        try:
            layout = Layout.from_json((self.demo.dir / "kafka" / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        network = layout.network
        nodes = [n for n, p in self.demo.broker_pids().items() if n != 0 and _alive(p)]
        if network is None or len(nodes) < 3:
            return None
        node = self.random.choice(sorted(nodes))
        network.partition(node)
        cut = time.monotonic()
        healed = False

        def back() -> bool:
            nonlocal healed
            if not healed:
                if time.monotonic() - cut < PARTITION_S:
                    return False
                network.heal(node)
                healed = True
            return self._in_every_isr(node)

        return f"broker node {node} cut off for {PARTITION_S:g} s, then healed", back

    def _in_every_isr(self, node: int) -> bool:
        from runtime.kafka_settings import KafkaSettings

        kafka = KafkaSettings.from_environ(self.demo.env)
        try:
            from runtime.offsets import offsets_consumer

            consumer = offsets_consumer(kafka)
            try:
                topic = consumer.list_topics(kafka.topic, timeout=5).topics[kafka.topic]
            finally:
                consumer.close()
        except Exception:  # the cluster between two elections
            return False
        return bool(topic.partitions) and all(node in p.isrs for p in topic.partitions.values())

    def _batch_task(self) -> tuple[str, Callable[[], bool]] | None:
        pids = [p for p in processes() if "cli/submit.py" in cmdline(p)]
        if not pids:
            return None
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        coverage = self.demo.lake / "batch" / "coverage" / "_delta_log"
        before = _commits(coverage)
        return (
            f"ctr_batch's spark-submit, pids {pids}",
            lambda: _commits(coverage) > before,
        )

    def _scheduler(self) -> tuple[str, Callable[[], bool]] | None:
        leader = self.demo.pid("airflow")
        if leader is None:
            return None
        procs = processes()
        found = [
            p.pid
            for p in procs.values()
            if p.pgid == leader and p.ppid != 1 and _is_scheduler(cmdline(p.pid))
        ]
        # the scheduler's main process: the one whose parent is not itself a scheduler
        mains = [pid for pid in found if procs[pid].ppid not in found]
        if not mains:
            return None
        pid = mains[0]
        os.kill(pid, signal.SIGKILL)

        def back() -> bool:
            current = processes()
            return any(
                p.pgid == leader and p.pid != pid and _is_scheduler(cmdline(p.pid))
                for p in current.values()
            )

        return f"airflow scheduler, pid {pid}", back


def _is_scheduler(command: str) -> bool:
    return "airflow scheduler" in command or command.endswith("airflow-scheduler ")


def _last_commit_at(checkpoint: Path) -> float:
    """When the streaming checkpoint's newest ``commits/N`` was written (0: none)."""
    try:
        return max(
            (p.stat().st_mtime for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
            default=0.0,
        )
    except OSError:
        return 0.0


def _commits(log_dir: Path) -> int:
    try:
        return sum(p.suffix == ".json" for p in log_dir.iterdir())
    except OSError:
        return 0


# --- the end: drain, exactness ---------------------------------------------------------------


def stop_producer(demo: Demo, ground_truth: Path, timeout_s: float = 120) -> None:
    pid = demo.pid("producer")
    if pid is None:
        raise SystemExit("soak: error: the producer is not running")
    log("stopping the traffic (the producer flushes and writes its ground truth)")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(1)
    if not ground_truth.exists():
        raise SystemExit(f"soak: error: the producer wrote no ground truth to {ground_truth}")


def drain(demo: Demo, timeout_s: float = 600) -> dict[str, int | None]:
    log("waiting for the archiver and the speed job to read the topic to its end")
    deadline = time.monotonic() + timeout_s
    lags = demo.lags()
    while time.monotonic() < deadline:
        lags = demo.lags()
        if all(v == 0 for v in lags.values()):
            break
        time.sleep(2)
    return lags


@dataclass
class Exactness:
    truth_events: int
    archived_rows: int
    archived_records: int  # distinct (partition, offset): Kafka records
    archived_distinct: int  # distinct event ids
    batch_rows_compared: int
    batch_rows_wrong: int
    batch_impressions: int
    batch_raw_clicks: int
    truth_impressions: int
    truth_clicks: int
    speed_impressions: int
    speed_minutes: int
    speed_error: float
    examples: list[str]

    @property
    def lost(self) -> int:
        return max(0, self.truth_events - self.archived_distinct)

    @property
    def duplicated(self) -> int:
        return self.archived_rows - self.archived_records

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.batch_rows_wrong == 0


def check_exactness(demo: Demo, ground_truth: Path, soak_window: tuple[int, int]) -> Exactness:
    """Recompute the batch view over every minute the producer wrote (late events included),
    then compare the master dataset, the exact view and the speed view with the truth."""
    from ingest.ground_truth import read_csv
    from lake.catalog import MASTER_EVENTS, batch_table
    from lake.coverage.log import read_runs
    from lake.duckdb_delta import delta_duckdb
    from lake.registry import read_registry
    from lake.settings import LakeSettings

    truth = read_csv(ground_truth)
    buckets = sorted({k[0] for k in truth})
    start = dt.datetime.fromtimestamp(buckets[0] / 1000, dt.UTC).replace(minute=0)
    end = dt.datetime.fromtimestamp(buckets[-1] / 1000 + 60, dt.UTC)
    iso = "%Y-%m-%dT%H:%M:%SZ"
    lake = LakeSettings(lake_root=demo.lake, checkpoint_root=demo.checkpoints)
    # What the batch layer covered while the speed layer ran: speed/ctr no longer holds it.
    covered_before = read_runs(lake).of(read_registry(lake).published("ctr").key)
    log(f"recomputing the exact view over {start:{iso}} .. {end:{iso}}")
    subprocess.run(
        [
            str(ROOT / ".venv/bin/ctr"),
            "batch",
            "--start",
            f"{start:{iso}}",
            "--end",
            f"{end:{iso}}",
            # Drained: the traffic has stopped, nothing more arrives, every minute is final.
            "--unsettled",
        ],
        env=demo.env,
        cwd=ROOT,
        check=True,
    )
    published = read_registry(lake).published("ctr")
    con = delta_duckdb()
    events = MASTER_EVENTS.path(lake)
    # Exactly once: each Kafka record (partition, offset) once; every delivered event's id there.
    rows, records, distinct = con.execute(
        f"""SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)),
                   count(DISTINCT event_id)
            FROM delta_scan('{events}')"""
    ).fetchone() or (0, 0, 0)
    clicks_col = "raw_clicks" if published.attribution else "clicks"
    batch = con.execute(
        f"""SELECT epoch_ms(bucket_start), campaign_id, ad_id, site_id, country, device_type,
                   sum(impressions), sum({clicks_col})
            FROM delta_scan('{batch_table(published).path(lake)}')
            WHERE bucket_start >= ? AND bucket_start < ?
            GROUP BY ALL""",
        [start, end],
    ).fetchall()
    view = {tuple(r[:6]): (int(r[6]), int(r[7])) for r in batch}
    keys = set(view) | {k for k, v in truth.items() if any(v)}
    wrong = [k for k in keys if view.get(k, (0, 0)) != truth.get(k, (0, 0))]
    low, high = soak_window
    # The speed layer's error, over the soak's minutes it still holds: the minutes the batch
    # layer covers are pruned from speed/ctr (the serving layer answers them from batch).
    speed_path = demo.lake / "speed" / "ctr"
    held = con.execute(
        f"""SELECT epoch_ms(bucket_start), sum(impressions) FROM delta_scan('{speed_path}')
            WHERE epoch_ms(bucket_start) >= ? AND epoch_ms(bucket_start) < ?
            GROUP BY 1""",
        [low, high],
    ).fetchall()
    uncovered = [
        (int(b), int(n))
        for b, n in held
        if not covered_before.covers(dt.datetime.fromtimestamp(int(b) / 1000, dt.UTC))
    ]
    minutes = {b for b, _ in uncovered}
    speed_impressions = sum(n for _, n in uncovered)
    truth_window = sum(v[0] for k, v in truth.items() if k[0] in minutes)
    return Exactness(
        truth_events=sum(i + c for i, c in truth.values()),
        archived_rows=int(rows),
        archived_records=int(records),
        archived_distinct=int(distinct),
        batch_rows_compared=len(keys),
        batch_rows_wrong=len(wrong),
        batch_impressions=sum(v[0] for v in view.values()),
        batch_raw_clicks=sum(v[1] for v in view.values()),
        truth_impressions=sum(v[0] for v in truth.values()),
        truth_clicks=sum(v[1] for v in truth.values()),
        speed_impressions=speed_impressions,
        speed_minutes=len(minutes),
        speed_error=(speed_impressions - truth_window) / truth_window if truth_window else 0.0,
        examples=[f"{k}: view {view.get(k)} truth {truth.get(k)}" for k in sorted(wrong)[:5]],
    )


# --- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def platform(demo: Demo, ground_truth: Path) -> Iterator[None]:
    demo.start(ground_truth)
    try:
        yield
    finally:
        if demo.running():
            demo.down()


def run(config: Config) -> int:
    demo = Demo(config)
    if demo.running():
        raise SystemExit(
            f"soak: error: a soak's demo is recorded under {demo.dir}; stop it first: "
            f"RUN_DIR={config.out} make demo-down"
        )
    import shutil

    shutil.rmtree(demo.dir, ignore_errors=True)  # a fresh lake and broker per soak
    config.out.mkdir(parents=True, exist_ok=True)
    for old in config.out.glob("*.png"):
        old.unlink()
    ground_truth = config.out / "ground-truth.csv"
    ground_truth.unlink(missing_ok=True)
    log(
        f"{config.minutes:g} min at {config.rate:,} events/s, sampling every {config.sample_s:g} s"
        + (
            f", chaos: a kill every {config.kill_every_s:g} s (seed {config.seed})"
            if config.chaos
            else ""
        )
    )
    with platform(demo, ground_truth):
        sampler = Sampler(demo, started=time.time())
        chaos = Chaos(demo, sampler, config) if config.chaos else None
        soak_start_ms = int(time.time() * 1000)
        duration = config.minutes * 60
        next_sample = 0.0
        next_kill = config.kill_every_s
        while (now := sampler.t()) < duration:
            if now >= next_sample:
                sampler.sample()
                next_sample += config.sample_s
                _progress(sampler, duration)
            if chaos is not None and now >= next_kill:
                chaos.strike()
                next_kill += config.kill_every_s
            time.sleep(1)
        sampler.sample()
        soak_end_ms = int(time.time() * 1000)
        if chaos is not None:
            log("waiting for the last kills to recover")
            chaos.wait(600)
        stop_producer(demo, ground_truth)
        lags = drain(demo)
        log(f"drained: {lags}")
        demo.down()
    exact = check_exactness(demo, ground_truth, (soak_start_ms + 600_000, soak_end_ms - 120_000))
    return write_report(config, sampler, chaos, exact, duration)


def _progress(sampler: Sampler, duration: float) -> None:
    latest: dict[str, float] = {}
    for _, name, value in sampler.rows:
        latest[name] = value
    rss = sum(v for k, v in latest.items() if k.startswith("rss_mb."))
    log(
        f"{sampler.t() / 60:5.1f}/{duration / 60:g} min  rss {rss:,.0f} MB  "
        f"lag archiver {latest.get('lag_records.archiver', float('nan')):,.0f} "
        f"speed {latest.get('lag_records.speed', float('nan')):,.0f}  "
        f"fresh {latest.get('freshness_s.speed', float('nan')):.1f} s  "
        f"p99 {latest.get('api_p99_ms.fixed_query', float('nan')):.0f} ms"
    )


def write_report(
    config: Config, sampler: Sampler, chaos: Chaos | None, exact: Exactness, duration: float
) -> int:
    out = config.out
    with (out / "samples.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t", "series", "value"])
        writer.writerows(sampler.rows)
    with (out / "requests.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t", "status", "ms"])
        writer.writerows(sampler.requests)
    kills = chaos.kills if chaos is not None else []
    with (out / "kills.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t", "target", "detail", "back_s", "lags_normal_s"])
        writer.writerows((k.t, k.target, k.detail, k.back_s, k.normal_s) for k in kills)
    found = soak_report.verdicts(sampler.rows, duration)
    plots = soak_report.plot(sampler.rows, out, events=[(k.t, k.target) for k in kills])
    api_kills = [k for k in kills if k.target == "api"]
    errors = [r for r in sampler.requests if r[1] >= 500 or r[1] == 0]
    excused = [
        r for r in errors if any(k.t <= r[0] <= k.t + (k.back_s or 900) + 5 for k in api_kills)
    ]
    unexcused = len(errors) - len(excused)
    judged = duration >= JUDGED_FROM_MINUTES * 60
    failures = [v for v in found if not v.passed] if judged else []
    recovered = [k for k in kills if k.normal_s is not None]
    slow = [k for k in kills if k.back_s is None or k.normal_s is None or k.normal_s > 60]
    ok = not failures and exact.passed and unexcused == 0 and (not config.chaos or not slow)
    lines = [
        f"# Soak report: {'PASS' if ok else 'FAIL'}",
        "",
        f"{config.minutes:g} min at {config.rate:,} events/s"
        + (f", chaos: {len(kills)} kills" if config.chaos else "")
        + f"; {len(sampler.rows):,} samples of {len({r[1] for r in sampler.rows})} series; "
        f"finished {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Rules: infra/soak_report.py.",
        "",
        "## Exactness after draining",
        "",
        f"- producer delivered {exact.truth_events:,} valid events; `master/events` holds "
        f"{exact.archived_rows:,} rows of {exact.archived_records:,} Kafka records (the "
        f"producer's resent duplicates among them), {exact.archived_distinct:,} distinct ids: "
        f"**{exact.lost:,} lost, {exact.duplicated:,} archived twice**",
        f"- exact view vs ground truth: {exact.batch_rows_wrong:,} of "
        f"{exact.batch_rows_compared:,} rows differ (impressions {exact.batch_impressions:,} vs "
        f"{exact.truth_impressions:,}, raw clicks {exact.batch_raw_clicks:,} vs "
        f"{exact.truth_clicks:,})",
        f"- speed view, impressions over the {exact.speed_minutes} minutes of the soak the batch "
        f"layer had not covered yet (the rest were pruned from speed/ctr): "
        f"{exact.speed_error:+.2%} from the truth (approximate by design)",
        f"- API: {len(sampler.requests):,} requests of the two fixed queries, {len(errors)} failed "
        f"(5xx or no answer), {len(excused)} of them while the API itself restarted",
    ]
    lines += [f"  - {e}" for e in exact.examples]
    lines += [
        "",
        "Retention windows scaled to the soak (each turns over in its first half): "
        + ", ".join(f"`{k}={v}`" for k, v in config.scaled_windows().items()),
    ]
    if config.chaos:
        normal = [k.normal_s for k in recovered if k.normal_s is not None]
        lines += [
            "",
            "## Kills and recovery",
            "",
            f"{len(kills)} kills, {len(recovered)} recovered; lags back to normal: "
            + (
                f"median {statistics.median(normal):.0f} s, max {max(normal):.0f} s"
                if normal
                else "none"
            ),
            "",
            "| at (min) | component | what | running again (s) | lags normal (s) |",
            "|---:|---|---|---:|---:|",
        ]
        lines += [
            f"| {k.t / 60:.1f} | {k.target} | {k.detail} | {k.back_s} | {k.normal_s} |"
            for k in kills
        ]
    lines += ["", "## Series", ""]
    if not judged:
        lines += [
            f"(A {config.minutes:g}-minute run: the series are shown, not judged; runs of "
            f"{JUDGED_FROM_MINUTES} minutes or more are.)",
            "",
        ]
    lines += [soak_report.table_markdown(found, judged=judged), ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    log(f"report: {out / 'report.md'} ({'PASS' if ok else 'FAIL'})")
    for v in failures:
        log(f"FAIL {v.series}: {v.reason}")
    if not exact.passed:
        log(
            f"FAIL exactness: {exact.lost} lost, {exact.duplicated} duplicated, "
            f"{exact.batch_rows_wrong} view rows wrong"
        )
    if unexcused:
        log(f"FAIL api: {unexcused} failed requests outside the API's restarts")
    if config.chaos and slow:
        log(f"FAIL recovery: {len(slow)} kill(s) not back to normal within 60 s")
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Settings come from the environment: SOAK_MINUTES, SOAK_RATE, CHAOS, "
        "SOAK_SAMPLE_S, SOAK_KILL_EVERY_S, SOAK_SEED, RUN_DIR.",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild report tables and plots from RUN_DIR/soak/samples.csv, run nothing",
    )
    args = parser.parse_args()
    config = Config.from_env()
    if args.report_only:
        samples = soak_report.read_samples(config.out / "samples.csv")
        duration = max(t for t, _, _ in samples)
        print(soak_report.table_markdown(soak_report.verdicts(samples, duration)))
        soak_report.plot(samples, config.out)
        return
    sys.exit(run(config))


if __name__ == "__main__":
    main()
