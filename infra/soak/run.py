"""One soak: the platform started, sampled (and struck, under chaos) for its minutes, then
stopped, drained and checked; the report written."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from infra.soak.chaos import Chaos
from infra.soak.config import Config
from infra.soak.console import log, progress
from infra.soak.demo import Demo
from infra.soak.exactness import check_exactness, drain, stop_producer
from infra.soak.report import write_report
from infra.soak.sampler import Sampler


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
                progress(sampler.rows, sampler.t(), duration)
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
