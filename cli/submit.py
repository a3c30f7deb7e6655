"""The spark-submit application of the Airflow tasks: `spark-submit cli/submit.py --start T1
--end T2 [--run-id ID] [--mode preview]` (``ctr_batch``; preview replaces nothing and prints what
the recompute would change), `… --stale` (``ctr_recompute_stale``) and `… --build VIEW --version
N [--from kafka]` (``ctr_reprocess``).

spark-submit chooses the cluster (`--master`); the procedures are :mod:`workflows`', the same
as `ctr batch`, `ctr batch --stale` and `ctr views build` run. Plain output, for task logs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli.console import printable

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

    from batch_layer.interval import Interval
    from lake.settings import LakeSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The Airflow tasks' spark-submit application: recompute the exact view for "
        "[--start, --end) (or preview it), recompute the stale hours (--stale), or build a "
        "view version (--build VIEW --version N [--from kafka])."
    )
    parser.add_argument("--start", help="ISO-8601 UTC, whole minute")
    parser.add_argument("--end", help="ISO-8601 UTC, whole minute, after start")
    parser.add_argument("--run-id", help="recorded in batch/ctr and batch/coverage")
    parser.add_argument(
        "--stale", action="store_true", help="recompute the stale hours instead of an interval"
    )
    parser.add_argument(
        "--mode",
        choices=["replace", "preview"],
        default="replace",
        help="preview: replace nothing, print what the recompute would change",
    )
    parser.add_argument("--build", metavar="VIEW", help="build a version of VIEW (--version)")
    parser.add_argument("--version", type=int, help="with --build: the version")
    parser.add_argument(
        "--from",
        dest="source",
        choices=["master", "kafka"],
        default="master",
        help="with --build: build from master/events or from a replay of the event topic",
    )
    args = parser.parse_args(argv)
    if args.build:
        if args.version is None or args.start or args.end or args.stale:
            parser.error("--build takes --version (and --from) and nothing else")
        return _build(args.build, args.version, args.source)
    if args.stale:
        if args.start or args.end or args.run_id:
            parser.error("--stale takes no --start, --end or --run-id")
        return _stale()
    if not (args.start and args.end):
        parser.error("--start and --end are required (or --stale)")

    from batch_layer.interval import Interval, IntervalError
    from lake.settings import LakeSettings

    try:
        interval = Interval.parse(args.start, args.end)
    except IntervalError as exc:
        parser.error(str(exc))
    lake = LakeSettings()
    if args.mode == "preview":
        return _guarded(lambda: _preview(_spark(lake), lake, interval))
    return _guarded(lambda: _recompute(_spark(lake), lake, interval, args.run_id))


def _spark(lake: LakeSettings) -> SparkSession:
    """The session spark-submit started, able to reach ``lake``'s object store."""
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings

    spark = spark_session(SparkSettings(), lake.object_store, submitted=True)
    print(f"spark master: {spark.sparkContext.master}")
    # What the driver got, not what was asked (a running driver ignores spark.driver.memory:
    # SPARK_DRIVER_MEMORY reaches it as spark-submit's --driver-memory).
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()  # type: ignore[union-attr]
    print(f"driver heap: {heap / 2**20:,.0f} MiB")
    return spark


def _guarded(step: Callable[[], int]) -> int:
    """``step``'s exit code; 1 with the message when the master dataset is missing."""
    from batch_layer.job import MissingTableError

    try:
        return step()
    except MissingTableError as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 1


def _recompute(
    spark: SparkSession, lake: LakeSettings, interval: Interval, run_id: str | None
) -> int:
    from runtime.metrics import MetricsSettings
    from workflows.batch import recompute

    runs = recompute(
        spark, lake, [interval], run_id=run_id, on_step=print, metrics=MetricsSettings()
    )
    for result in runs:
        print(f"done: run {result.run_id}, {result.rows_written} rows for {result.interval}")
    return 0


def _stale() -> int:
    from lake.settings import LakeSettings
    from runtime.metrics import MetricsSettings
    from workflows.stale import plan, recompute

    lake = LakeSettings()
    stale = plan(lake)
    if not stale.intervals:
        print("nothing is stale")
        return 0
    print(f"{stale.buckets} stale minute(s), {stale.events} late event(s)")

    def run() -> int:
        runs = recompute(
            _spark(lake),
            lake,
            stale,
            on_interval=lambda i: print(f"recomputing {i}"),
            metrics=MetricsSettings(),
        )
        for done in runs:
            print(f"done: run {done.run_id}, {done.rows_written} rows for {done.interval}")
        return 0

    return _guarded(run)


def _preview(spark: SparkSession, lake: LakeSettings, interval: Interval) -> int:
    from cli.comparison import print_comparison
    from cli.console import SafeConsole
    from workflows.batch import previews

    [result] = previews(spark, lake, [interval])
    print_comparison(result, SafeConsole())
    print("nothing was replaced")
    return 0


def _build(view: str, version: int, source: str) -> int:
    from lake.settings import LakeSettings
    from runtime.metrics import MetricsSettings
    from views.definitions import UnknownVersionError, definition
    from workflows.build import build, plan_build, replay_and_build

    try:
        target = definition(view, version)
    except UnknownVersionError as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 2
    lake = LakeSettings()
    if source == "kafka":
        from runtime.kafka_settings import KafkaSettings

        def replay() -> int:
            print(f"{target.key}: replaying the event topic from its earliest offset")
            plan, _ = replay_and_build(
                _spark(lake),
                lake,
                KafkaSettings(),
                target,
                on_plan=lambda p: print(f"{len(p.intervals)} hour(s) to build"),
                on_interval=lambda i: print(f"building {i}"),
                metrics=MetricsSettings(),
            )
            if plan.outside:
                print(f"{len(plan.outside)} hour(s) before the retained log begins left out")
            return 0

        return _guarded(replay)
    plan = plan_build(lake, target)
    print(f"{target.key}: {len(plan.done)} hour(s) built, {len(plan.intervals)} to build")
    spark = _spark(lake) if plan.intervals else None

    def run() -> int:
        build(
            spark,
            lake,
            plan,
            on_interval=lambda i: print(f"building {i}"),
            metrics=MetricsSettings(),
        )
        return 0

    return _guarded(run)


if __name__ == "__main__":
    # Run as a file (spark-submit's way): Python puts this file's folder first on sys.path,
    # where cli/views.py, cli/kafka.py, … would shadow the packages of the same names.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    sys.exit(main())
