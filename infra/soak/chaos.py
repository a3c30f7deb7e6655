"""`make soak CHAOS=1`: a component SIGKILLed (or a broker cut off) every few minutes, and the
time the project's own supervision takes to bring it back."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infra.soak.config import Config
from infra.soak.console import log
from infra.soak.demo import Demo
from infra.soak.processes import alive, cmdline, kill_tree, processes
from infra.soak.sampler import Sampler

PARTITION_S: Final = 20.0  # how long a chaos round cuts a broker off


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
        if not alive(pid):
            return None
        assert pid is not None
        doomed = kill_tree(pid)

        killed_at = time.time()

        def back() -> bool:
            new = self.demo.child(name)
            if new is None or new == pid or not alive(new):
                return False
            if name == "api":
                return self.demo.api("/healthz", timeout=2)[0] == 200
            # a streaming job is back once it has committed a micro-batch again
            return _last_commit_at(self.demo.checkpoints / name) > killed_at

        return f"pid {pid} and {len(doomed) - 1} below it", back

    def _broker(self) -> tuple[str, Callable[[], bool]] | None:
        nodes = {n: p for n, p in self.demo.broker_pids().items() if n != 0 and alive(p)}
        if len(nodes) < 2:  # one broker: killing it is an outage, not a failover
            return None
        node = self.random.choice(sorted(nodes))
        pid = nodes[node]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        def back() -> bool:
            new = self.demo.broker_pids().get(node)
            return new is not None and new != pid and alive(new)

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
        nodes = [n for n, p in self.demo.broker_pids().items() if n != 0 and alive(p)]
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
