"""Entry point for `spark-submit batch_layer/submit.py --start T1 --end T2 [--mode preview]` (the
ctr_batch task; preview replaces nothing and prints what the recompute would change), `… --stale`
(recompute what late events made stale; ctr_recompute_stale) and `… --build VIEW --version N`
(build a view version; ctr_reprocess).

spark-submit chooses the cluster (`--master`); the job itself is `batch_layer.job.run`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from batch_layer.interval import Interval


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Recompute batch/ctr for [start, end).")
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
    args = parser.parse_args(argv)
    if args.build:
        if args.version is None or args.start or args.end or args.stale:
            parser.error("--build takes --version and nothing else")
        return _build(args.build, args.version)
    if args.stale:
        if args.start or args.end or args.run_id:
            parser.error("--stale takes no --start, --end or --run-id")
        return _stale()
    if not (args.start and args.end):
        parser.error("--start and --end are required (or --stale)")

    from batch_layer.interval import Interval, IntervalError
    from batch_layer.job import MissingTableError, run
    from lake.settings import LakeSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings

    try:
        interval = Interval.parse(args.start, args.end)
    except IntervalError as exc:
        parser.error(str(exc))
    spark = spark_session(SparkSettings(), submitted=True)
    print(f"spark master: {spark.sparkContext.master}")
    if args.mode == "preview":
        return _preview(spark, interval)
    try:
        result = run(spark, interval, lake=LakeSettings(), run_id=args.run_id, on_step=print)
    except MissingTableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done: run {result.run_id}, {result.rows_written} rows for {interval}")
    return 0


def _stale() -> int:
    from batch_layer.job import MissingTableError
    from batch_layer.stale import plan, recompute
    from lake.settings import LakeSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings

    lake = LakeSettings()
    stale = plan(lake)
    if not stale.intervals:
        print("nothing is stale")
        return 0
    print(f"{stale.buckets} stale minute(s), {stale.events} late event(s)")
    spark = spark_session(SparkSettings(), submitted=True)
    print(f"spark master: {spark.sparkContext.master}")
    try:
        runs = recompute(spark, lake, stale, on_interval=lambda i: print(f"recomputing {i}"))
    except MissingTableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for done in runs:
        print(f"done: run {done.run_id}, {done.rows_written} rows for {done.interval}")
    return 0


def _preview(spark: SparkSession, interval: Interval) -> int:
    from batch_layer.job import MissingTableError
    from batch_layer.preview import preview
    from lake.registry import read_registry
    from lake.settings import LakeSettings

    lake = LakeSettings()
    view = read_registry(lake).published("ctr")
    try:
        result = preview(spark, interval, lake=lake, definition=view)
    except MissingTableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    (i_now, i_after), (c_now, c_after) = result.impressions, result.clicks
    print(
        f"preview of {interval} ({view.key}, master/events v{result.input_version}): "
        f"{result.rows_changed} of {result.rows_compared} rows change; impressions {i_now} -> "
        f"{i_after}, clicks {c_now} -> {c_after}; nothing was replaced"
    )
    for bucket, dims, impressions, clicks in result.largest:
        print(f"  {bucket.isoformat()} {dims}: impressions {impressions}, clicks {clicks}")
    return 0


def _build(view: str, version: int) -> int:
    from batch_layer.job import MissingTableError
    from batch_layer.reprocess import build, plan_build
    from lake.settings import LakeSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings
    from views.definitions import UnknownVersionError, definition

    try:
        target = definition(view, version)
    except UnknownVersionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lake = LakeSettings()
    plan = plan_build(lake, target)
    print(f"{target.key}: {len(plan.done)} hour(s) built, {len(plan.intervals)} to build")
    spark = spark_session(SparkSettings(), submitted=True) if plan.intervals else None
    if spark is not None:
        print(f"spark master: {spark.sparkContext.master}")
    try:
        build(spark, lake, plan, on_interval=lambda i: print(f"building {i}"))
    except MissingTableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
