"""The soak's minute samples: memory and CPU per component, table and checkpoint files and
bytes, Kafka's bytes, the streaming jobs' lags, the API's freshness and latency."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from infra.soak.demo import Demo
from infra.soak.processes import TICKS, alive, own_memory, processes

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
# The demo components whose process groups are sampled (their pid files under the demo dir).
COMPONENTS: Final = ("producer", "archiver", "speed", "api", "airflow", "broker-watch")
# Tables whose bytes grow with the data by design (the master dataset, the exact views).
DATA_TABLES: Final = ("master/events", "master/rejected", "batch/ctr")


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
            if pid is not None and alive(pid):
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
