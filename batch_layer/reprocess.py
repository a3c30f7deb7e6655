"""Build a version of a view over the history the published version covers, interval by
interval with the batch job, from master/events (`ctr views build`, the ``ctr_reprocess`` DAG).

The published version keeps serving meanwhile: a build writes only its own table
(``batch/ctr_vN``) and its own coverage rows. It is resumable: hours the version already covers
are skipped, so a second call after an interruption (or after ``ctr_batch`` covered new hours of
the published version) builds only what is missing. The registry says ``building`` while it runs
and ``ready`` once the version covers everything the published version covers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from batch_layer.job import BatchRun, run
from lake.coverage import Coverage
from lake.coverage_log import read_coverage
from lake.registry import read_registry, record
from lake.settings import LakeSettings
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class BuildPlan:
    definition: Definition
    published: Definition
    intervals: tuple[Interval, ...]  # still to build, in order
    done: tuple[Interval, ...]  # already covered by the version


def plan_build(lake: LakeSettings, target: Definition) -> BuildPlan:
    """The hours of the published version's coverage, cut to it, that ``target`` does not
    cover yet."""
    published = read_registry(lake).published(target.view)
    history = read_coverage(lake, published.key)
    covered = read_coverage(lake, target.key)
    todo, done = [], []
    for interval in history.intervals:
        for hour in Interval(interval.start, interval.end).hours():
            if covered.covered_span(hour.start, hour.end) >= hour.end - hour.start:
                done.append(hour)
            else:
                todo.append(hour)
    return BuildPlan(target, published, tuple(todo), tuple(done))


def caught_up(lake: LakeSettings, target: Definition) -> Coverage:
    """What the published version covers and ``target`` does not (empty: caught up)."""
    published = read_registry(lake).published(target.view)
    history = read_coverage(lake, published.key)
    covered = read_coverage(lake, target.key)
    missing = []
    for interval in history.intervals:
        cursor = interval.start
        for lo, hi in covered.within(interval.start, interval.end):
            if cursor < lo:
                missing.append((cursor, lo))
            cursor = hi
        if cursor < interval.end:
            missing.append((cursor, interval.end))
    return Coverage(missing)


def build(
    spark: SparkSession | None,
    lake: LakeSettings,
    plan: BuildPlan,
    *,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_run: Callable[[BatchRun], None] = lambda done: None,
) -> list[BatchRun]:
    """Run the batch job for ``plan.definition`` over every interval of the plan (``spark``
    may be None when there is none); records ``building`` first and ``ready`` once the version
    has caught up."""
    target = plan.definition
    registry = read_registry(lake)
    if registry.state(target.view, target.version) not in ("building", "published"):
        record(lake, target.view, target.version, "building", f"build of {len(plan.intervals)} h")
    runs = []
    for interval in plan.intervals:
        if spark is None:
            raise ValueError("a SparkSession is needed to build intervals")
        on_interval(interval)
        runs.append(run(spark, interval, lake=lake, definition=target))
        on_run(runs[-1])
    if not caught_up(lake, target).intervals and registry.state(target.view, target.version) != (
        "published"
    ):
        record(lake, target.view, target.version, "ready", "covers what the published version does")
    return runs
