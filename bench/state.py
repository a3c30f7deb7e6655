"""The speed layer's attribution state: ours (:mod:`speed_layer.state`, Arrow files per Kafka
partition) against Spark's own (``transformWithStateInPandas``, RocksDB), both on the shared
object store, on the same events, micro-batches and partitions (issue 67).

The local S3 server (SeaweedFS, as `ctr s3 up` runs it) starts under a scratch folder. The
speed benchmark's traffic (5,000 events/s, with repeated and orphan clicks, resent records and
late events: :mod:`bench.state_traffic`) is cut into MINUTES x 60 one-second micro-batches, plus
one for the cold starts, over the speed benchmark's 6 partitions, generated faster than real
time. Then:

1. **Ours** (:mod:`bench.state_ours`), in this process as the speed job's tasks call it, the
   state on the store: per micro-batch (its partitions' calls summed: one core) the time split
   into read / attribute / write / snapshot, the objects written, the driver's expiry; then a
   cold start on the next batch (objects read and seconds per partition). Twice: with snapshots
   (every 120 change files, the default) and without.
2. **Spark's** (:mod:`bench.state_spark`, :mod:`bench.state_processor`), a query in a process
   of its own per mode over the first SPARK_MINUTES x 60 of the same batch files, its
   checkpoint on the store: ``baseline`` (no state: what the engine costs a batch anyway), then
   each state mode (``pandas``: ``transformWithStateInPandas``; ``row``: ``transformWithState``,
   what Spark's guide suggests for many keys); per batch the latency and the state operator's
   metrics, the state's objects and bytes on the store; then the process is SIGKILLed and a new
   one restarts on the next batch (a cold restart, timed). SPARK_MINUTES is 2 by default: the
   state modes take seconds per one-second batch at 5,000 events/s on 2 cores, so an hour of
   batches would take about ten; over the first minutes no timer has fired yet (the first
   bucket closes at minute 11 under the 10-minute watermark) and the state holds fewer keys than
   it will, so Spark's figures are a lower bound of its steady cost.
3. **The check**: the clicks attributed, repeated and orphaned per impression bucket by each
   Spark state mode equal ours on the same batches (printed; a difference fails the benchmark).

``python -m bench state`` runs the full size; ``python -m bench.state --help`` takes the sizes
(``--minutes``, ``--spark-minutes``, ``--partitions``, ``--rate``, ``--watermark``, ``--modes``);
a run shorter than an hour writes ``bench/results/state-smoke.json``, not the results table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from bench import state_ours
from bench.state_checkpoint import checkpoint_objects
from bench.state_report import report
from bench.state_traffic import BatchPlan, write_batches
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from runtime.object_store import ObjectStoreSettings
from speed_layer.job import ATTRIBUTION
from speed_layer.settings import SpeedSettings
from speed_layer.state import SNAPSHOT_EVERY

RESULTS: Final = Path("bench/results")
BUCKET: Final = "bench"
NO_SNAPSHOTS: Final = 10**9  # snapshot_every that never comes
STATE_MODES: Final = ("pandas", "row")


@dataclass(frozen=True)
class StateBenchSettings:
    """The benchmark's sizes (``BENCH_STATE_*`` in the environment, or the flags)."""

    minutes: int = 60  # event time of traffic before the cold starts (the goal: 1 h)
    # Spark's share of it, from its start: its state takes seconds per one-second batch at
    # 5,000 events/s on 2 cores (the smoke runs), so an hour of it would take about ten.
    spark_minutes: int = 2
    partitions: int = 6  # the speed benchmark's topic (KAFKA_TOPIC_PARTITIONS' default)
    rate: int = 5_000  # events per second (the speed benchmark's steady rate)
    watermark: str = SpeedSettings.model_fields["watermark"].default
    modes: tuple[str, ...] = STATE_MODES  # Spark's state modes, after the baseline

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> StateBenchSettings:
        """The sizes ``python -m bench state`` runs (each unset: the full run's)."""
        default = cls()
        #: The attribution-state benchmark's minutes of traffic before the cold starts; default
        #: 60 (the goal's hour). Below 60 its result is a smoke run's (state-smoke.json).
        minutes = environ.get("BENCH_STATE_MINUTES")
        #: The attribution-state benchmark's minutes of traffic for Spark's state, from the
        #: start; default 2.
        spark_minutes = environ.get("BENCH_STATE_SPARK_MINUTES")
        #: The attribution-state benchmark's Kafka partitions; default 6 (the speed
        #: benchmark's topic).
        partitions = environ.get("BENCH_STATE_PARTITIONS")
        #: The attribution-state benchmark's events per second; default 5000 (the speed
        #: benchmark's steady rate).
        rate = environ.get("BENCH_STATE_RATE")
        #: The attribution-state benchmark's watermark delay, as SPEED_WATERMARK; default the
        #: speed job's (10 minutes).
        watermark = environ.get("BENCH_STATE_WATERMARK")
        #: The attribution-state benchmark's Spark state modes after its baseline,
        #: comma-separated: pandas (transformWithStateInPandas), row (transformWithState);
        #: default both.
        modes = environ.get("BENCH_STATE_MODES")
        return cls(
            minutes=int(minutes) if minutes else default.minutes,
            spark_minutes=int(spark_minutes) if spark_minutes else default.spark_minutes,
            partitions=int(partitions) if partitions else default.partitions,
            rate=int(rate) if rate else default.rate,
            watermark=watermark or default.watermark,
            modes=tuple(m for m in modes.split(",") if m) if modes else default.modes,
        ).checked()

    def checked(self) -> StateBenchSettings:
        if self.minutes < 1:
            raise ValueError(f"minutes must be at least 1, got {self.minutes}")
        if not 1 <= self.spark_minutes <= self.minutes:
            raise ValueError(
                f"spark minutes must be in [1, {self.minutes}], got {self.spark_minutes}"
            )
        if self.partitions < 1 or self.rate < 1:
            raise ValueError("partitions and rate must be at least 1")
        if unknown := set(self.modes) - set(STATE_MODES):
            raise ValueError(f"unknown Spark state modes {sorted(unknown)}: use {STATE_MODES}")
        SpeedSettings(watermark=self.watermark)  # refuses a malformed duration
        return self

    @property
    def batches(self) -> int:
        return self.minutes * 60

    @property
    def spark_batches(self) -> int:
        return self.spark_minutes * 60

    @property
    def watermark_ms(self) -> int:
        return SpeedSettings(watermark=self.watermark).watermark_ms

    @property
    def smoke(self) -> bool:
        """Shorter than the goal's hour, or off the speed benchmark's rate, partitions or the
        speed job's watermark."""
        default = StateBenchSettings()
        return self.minutes < default.minutes or (self.rate, self.partitions, self.watermark) != (
            default.rate,
            default.partitions,
            default.watermark,
        )


def main(events: int | None = None) -> dict[str, object]:
    """``events``: the traffic's size (MINUTES = events / rate / 60, at least 1)."""
    settings = StateBenchSettings.from_environ(os.environ)
    if events is not None:
        minutes = max(1, round(events / settings.rate / 60))
        spark_minutes = min(settings.spark_minutes, minutes)
        settings = replace(settings, minutes=minutes, spark_minutes=spark_minutes).checked()
    return run(settings)


def run(settings: StateBenchSettings) -> dict[str, object]:
    print(
        f"bench state: {settings.minutes} min of traffic at {settings.rate:,} events/s over "
        f"{settings.partitions} partition(s), Spark over {settings.spark_batches // 60} min "
        f"(modes: baseline, {', '.join(settings.modes)})",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ctr-bench-state-") as scratch:
        work = Path(scratch)
        with _s3(work) as (store, environ):
            return _run(settings, store, environ, work)


@contextlib.contextmanager
def _s3(work: Path) -> Iterator[tuple[ObjectStoreSettings, dict[str, str]]]:
    """The local S3 server; the store's settings and the environment a process needs for it."""
    server = LocalS3(LocalS3Settings(run_dir=work / "s3run", port=free_base_port(), bucket=BUCKET))
    server.start()
    try:
        environ = {**server.environment(), "LAKE_ROOT": f"s3://{BUCKET}/lake"}
        store = ObjectStoreSettings.model_validate(environ)
        yield store, environ
    finally:
        server.stop()


def _run(
    settings: StateBenchSettings, store: ObjectStoreSettings, environ: dict[str, str], work: Path
) -> dict[str, object]:
    started = time.monotonic()
    print(f"bench state: generating {settings.batches + 1:,} micro-batches ...", flush=True)
    plans = write_batches(
        work / "batches",
        batches=settings.batches + 1,
        partitions=settings.partitions,
        rate=settings.rate,
        watermark_ms=settings.watermark_ms,
    )
    print(
        f"bench state: {sum(p.events for p in plans):,} events in "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    ours = {}
    for label, every in (("snapshots", SNAPSHOT_EVERY), ("no_snapshots", NO_SNAPSHOTS)):
        print(f"bench state: ours, {label.replace('_', ' ')} ...", flush=True)
        ours[label] = state_ours.run(
            plans,
            root=f"s3://{BUCKET}/ours-{label}/attribution",
            store=store,
            partitions=settings.partitions,
            snapshot_every=every,
            label=label,
        )
    spark: dict[str, dict[str, Any]] = {}
    for mode in ("baseline", *settings.modes):
        print(f"bench state: Spark, {mode} ...", flush=True)
        spark[mode] = _spark(
            mode, plans[: settings.spark_batches + 1], settings, store, environ, work
        )
    result = report(settings, plans, ours, spark)
    result["seconds"] = round(time.monotonic() - started)
    name = "state-smoke" if settings.smoke else "state"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"bench state: result in {RESULTS / name}.json ({result['seconds']} s)")
    if not result["correctness"]["equal"]:
        raise RuntimeError("Spark's state attributed other counts than ours: see the check above")
    return result


def _spark(  # noqa: PLR0917
    mode: str,
    plans: list[BatchPlan],
    settings: StateBenchSettings,
    store: ObjectStoreSettings,
    environ: dict[str, str],
    work: Path,
) -> dict[str, Any]:
    """One Spark mode: the run over every batch but the last, killed; the restart on the last."""
    folder = work / f"spark-{mode}"
    source = folder / "input"
    source.mkdir(parents=True)
    warm, cold = plans[:-1], plans[-1]
    for plan in warm:
        os.link(plan.path, source / Path(plan.path).name)
    checkpoint = f"s3://{BUCKET}/spark-{mode}/checkpoint"
    common = [
        "--mode",
        mode,
        "--input",
        str(source),
        "--checkpoint",
        checkpoint,
        "--partitions",
        str(settings.partitions),
        "--watermark-ms",
        str(settings.watermark_ms),
        "--window-ms",
        str(int(ATTRIBUTION.total_seconds() * 1000)),
    ]
    print(
        f"bench state: Spark {mode}: {len(warm):,} batches (its log: {folder / 'run.log'})",
        flush=True,
    )
    began = time.monotonic()
    run_out = folder / "run.json"
    _child(
        [
            *common,
            "--batches",
            str(len(warm)),
            "--out",
            str(run_out),
            "--kill",
            "--log",
            str(folder / "run-spark.log"),
        ],
        environ,
        folder / "run.log",
        timeout_s=600 + 30 * len(warm),
    )
    print(
        f"bench state: Spark {mode}: {len(warm):,} batches in {time.monotonic() - began:.0f} s "
        "(with the JVM's start); killed",
        flush=True,
    )
    objects = checkpoint_objects(checkpoint, store)
    os.link(cold.path, source / Path(cold.path).name)
    restart_out = folder / "restart.json"
    _child(
        [
            *common,
            "--batches",
            "1",
            "--out",
            str(restart_out),
            "--log",
            str(folder / "restart-spark.log"),
        ],
        environ,
        folder / "restart.log",
        timeout_s=900,
    )
    return {
        "run": json.loads(run_out.read_text()),
        "restart": json.loads(restart_out.read_text()),
        "checkpoint": objects,
    }


def _child(args: list[str], environ: dict[str, str], log: Path, *, timeout_s: float) -> None:
    """``python -m bench.state_spark ARGS`` in a process group of its own (its --kill ends the
    group: it, its JVM and its Python workers)."""
    command = [sys.executable, "-m", "bench.state_spark", *args]
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            env={**os.environ, **environ},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            raise RuntimeError(
                f"bench.state_spark timed out after {timeout_s:.0f} s: see {log}"
            ) from None
    killed = "--kill" in args and code == -9
    out_file = Path(args[args.index("--out") + 1])
    if (code != 0 and not killed) or not out_file.exists():
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"bench.state_spark {' '.join(args[:2])} failed ({code}):\n{tail}")


def cli(argv: list[str] | None = None) -> int:
    defaults = StateBenchSettings()
    parser = argparse.ArgumentParser(
        prog="python -m bench.state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--minutes",
        type=int,
        default=defaults.minutes,
        help="event time of traffic before the cold starts (default: %(default)s)",
    )
    parser.add_argument(
        "--spark-minutes",
        type=int,
        default=defaults.spark_minutes,
        help="Spark's share of it, from its start (default: %(default)s)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=defaults.partitions,
        help="Kafka partitions (default: %(default)s)",
    )
    parser.add_argument(
        "--rate", type=int, default=defaults.rate, help="events per second (default: %(default)s)"
    )
    parser.add_argument(
        "--watermark",
        default=defaults.watermark,
        help="the speed job's watermark delay (default: %(default)s)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(defaults.modes),
        help=f"Spark's state modes, of {','.join(STATE_MODES)} (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    settings = StateBenchSettings(
        minutes=args.minutes,
        spark_minutes=args.spark_minutes,
        partitions=args.partitions,
        rate=args.rate,
        watermark=args.watermark,
        modes=tuple(m for m in args.modes.split(",") if m),
    ).checked()
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
