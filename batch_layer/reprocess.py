"""Build a version of a view over the history the published version covers, interval by
interval with the batch job, from master/events (`ctr views build`, the ``ctr_reprocess`` DAG)
or from a replay of the Kafka log (`ctr views build --from kafka`: a second archiving query
from the earliest offset into a private master dataset, then the same batch job over it).

The published version keeps serving meanwhile: a build writes only its own table
(``batch/ctr_vN``) and its own coverage rows. It is resumable: hours the version already covers
are skipped, so a second call after an interruption (or after ``ctr_batch`` covered new hours of
the published version) builds only what is missing. The registry says ``building`` while it runs
and ``ready`` once the version covers everything the published version covers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from batch_layer.job import BatchRun, Replay, run
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
    outside: tuple[Interval, ...] = ()  # before `since`: not in the source


def plan_build(
    lake: LakeSettings, target: Definition, *, since: dt.datetime | None = None
) -> BuildPlan:
    """The hours of the published version's coverage, cut to it, that ``target`` does not
    cover yet; with ``since`` (where a replayed log begins), only hours from then on."""
    published = read_registry(lake).published(target.view)
    history = read_coverage(lake, published.key)
    covered = read_coverage(lake, target.key)
    todo, done, outside = [], [], []
    for interval in history.intervals:
        for hour in Interval(interval.start, interval.end).hours():
            if covered.covered_span(hour.start, hour.end) >= hour.end - hour.start:
                done.append(hour)
            elif since is not None and hour.start < since:
                outside.append(hour)
            else:
                todo.append(hour)
    return BuildPlan(target, published, tuple(todo), tuple(done), tuple(outside))


def replay_lake(lake: LakeSettings, target: Definition) -> LakeSettings:
    """Where a Kafka replay for ``target`` keeps its private master dataset and checkpoint."""
    name = target.key.replace("@", "_")
    return LakeSettings(
        lake_root=lake.lake_root / "replays" / name,
        checkpoint_root=lake.checkpoint_root / "replays" / name,
    )


def replayed_since(replay: LakeSettings) -> dt.datetime | None:
    """The first whole hour a replay holds completely: after its earliest record's ingest
    time (what Kafka's retention left). None: nothing replayed."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(replay.events):
        return None
    times = DeltaTable(replay.events).to_pyarrow_table(columns=["ingest_time"]).column(0)
    earliest = min(times.to_pylist(), default=None)
    if not isinstance(earliest, dt.datetime):
        return None
    first = earliest.astimezone(dt.UTC)
    hour = first.replace(minute=0, second=0, microsecond=0)
    return hour if hour == first else hour + dt.timedelta(hours=1)


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
    replay: Replay | None = None,
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
        runs.append(run(spark, interval, lake=lake, definition=target, replay=replay))
        on_run(runs[-1])
    if not caught_up(lake, target).intervals and registry.state(target.view, target.version) != (
        "published"
    ):
        record(lake, target.view, target.version, "ready", "covers what the published version does")
    return runs
