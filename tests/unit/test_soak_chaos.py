"""make soak CHAOS=1's choice of what to strike (infra/soak/chaos.py Chaos.strike): each target once
per round in a random order; a target with nothing to kill now (a batch task between runs)
waits first in line. Stand-in targets and demo, no processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from infra.soak.chaos import Chaos
from infra.soak.config import Config
from infra.soak.demo import Demo
from infra.soak.sampler import Sampler


class FakeDemo:
    def lags(self) -> dict[str, int | None]:
        return {"archiver": 0, "speed": 0}


def chaos(runnable: set[str]) -> tuple[Chaos, list[str]]:
    config = Config(
        minutes=1,
        rate=1000,
        chaos=True,
        sample_s=60,
        kill_every_s=60,
        seed=3,
        run_dir=Path("."),
        environ={},
    )
    demo = cast(Demo, FakeDemo())
    struck: list[str] = []
    subject = Chaos(demo, Sampler(demo, started=time.time()), config)

    def target(name: str) -> Callable[[], tuple[str, Callable[[], bool]] | None]:
        def strike() -> tuple[str, Callable[[], bool]] | None:
            if name not in runnable:
                return None
            struck.append(name)
            return name, lambda: True

        return strike

    subject.targets = {name: target(name) for name in subject.targets}
    return subject, struck


def test_every_target_once_per_round() -> None:
    subject, struck = chaos(
        {"archiver", "speed", "api", "broker", "partition", "batch-task", "scheduler"}
    )
    for _ in range(14):
        subject.strike()
    assert sorted(struck[:7]) == sorted(subject.targets)
    assert sorted(struck[7:]) == sorted(subject.targets)
    assert struck[:7] != struck[7:] or len(set(struck)) == 1  # a new order per round (seed 3)
    subject.wait(10)
    assert all(k.back_s is not None and k.normal_s is not None for k in subject.kills)


def test_a_target_with_nothing_to_kill_waits_first_in_line() -> None:
    runnable = {"archiver", "speed", "api", "broker", "partition", "scheduler"}
    subject, struck = chaos(runnable)
    for _ in range(8):
        subject.strike()
    assert "batch-task" not in struck
    assert len(struck) == 8  # the others went on, into a second round
    runnable.add("batch-task")
    subject.strike()
    assert struck[-1] == "batch-task"
