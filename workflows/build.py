"""Build a version of a view over the history the published version covers, interval by
interval with the batch job, from master/events or from a replay of the Kafka log
(:func:`replay_and_build`: a second archiving query from the earliest offset into a private
master dataset, then the same batch job over it): `ctr views build [--from kafka]` and the
``ctr_reprocess`` DAG.

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
from batch_layer.job import BatchJob, BatchRun, Replay
from lake.catalog import MASTER_EVENTS
from lake.coverage.log import read_runs
from lake.coverage.model import Coverage
from lake.registry import Registry, read_registry, record
from lake.settings import LakeSettings
from lake.storage import is_delta, open_delta
from runtime.times import LATEST
from views.definitions import Definition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from runtime.kafka_settings import KafkaSettings
    from runtime.metrics import MetricsSettings


@dataclass(frozen=True)
class BuildPlan:
    definition: Definition
    published: Definition
    intervals: tuple[Interval, ...]  # still to build, in order
    done: tuple[Interval, ...]  # already covered by the version
    outside: tuple[Interval, ...] = ()  # before `since`: not in the source
    registry: Registry | None = None  # what it was planned from


def plan_build(
    lake: LakeSettings, target: Definition, *, since: dt.datetime | None = None
) -> BuildPlan:
    """The hours of the published version's coverage, cut to it, that ``target`` does not
    cover yet; with ``since`` (where a replayed log begins), only hours from then on."""
    registry = read_registry(lake)
    published = registry.published(target.view)
    runs = read_runs(lake)
    history, covered = runs.of(published.key), runs.of(target.key)
    todo, done, outside = [], [], []
    for interval in history.intervals:
        for hour in Interval(interval.start, interval.end).hours():
            if covered.holds(hour.start, hour.end):
                done.append(hour)
            elif since is not None and hour.start < since:
                outside.append(hour)
            else:
                todo.append(hour)
    return BuildPlan(target, published, tuple(todo), tuple(done), tuple(outside), registry)


def replay_lake(lake: LakeSettings, target: Definition) -> LakeSettings:
    """Where a Kafka replay for ``target`` keeps its private master dataset and checkpoint."""
    name = target.key.replace("@", "_")
    return lake.under("replays", name)


def replayed_since(replay: LakeSettings) -> dt.datetime | None:
    """The first whole hour a replay holds completely: after its earliest record's ingest
    time (what Kafka's retention left). None: nothing replayed. Read from the files' statistics
    in the log (the smallest ``minValues.ingest_time``): no data file is opened."""
    import pyarrow as pa
    import pyarrow.compute as pc

    path, store = MASTER_EVENTS.path(replay), replay.object_store
    if not is_delta(path, store):
        return None
    table = open_delta(path, store)
    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return None
    lows = files.column("min.ingest_time") if "min.ingest_time" in files.column_names else None
    if lows is None or lows.null_count:  # a file without statistics (not the archiver's)
        earliest = pc.min(table.to_pyarrow_table(columns=["ingest_time"]).column(0)).as_py()
    else:
        earliest = pc.min(lows).as_py()
    if not isinstance(earliest, dt.datetime):
        return None
    first = earliest.astimezone(dt.UTC)
    hour = first.replace(minute=0, second=0, microsecond=0)
    return hour if hour == first else hour + dt.timedelta(hours=1)


def missing(lake: LakeSettings, target: Definition, registry: Registry | None = None) -> Coverage:
    """What the published version covers and ``target`` does not (empty: caught up)."""
    published = (registry or read_registry(lake)).published(target.view)
    runs = read_runs(lake)
    return runs.of(published.key).minus(runs.of(target.key))


def build(
    spark: SparkSession | None,
    lake: LakeSettings,
    plan: BuildPlan,
    *,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_run: Callable[[BatchRun], None] = lambda done: None,
    replay: Replay | None = None,
    metrics: MetricsSettings | None = None,
) -> list[BatchRun]:
    """Run the batch job for ``plan.definition`` over every interval of the plan (``spark``
    may be None when there is none; each run's figures pushed to ``metrics``' Pushgateway);
    records ``building`` first and ``ready`` once the version has caught up."""
    target = plan.definition
    registry = plan.registry or read_registry(lake)
    state = registry.state(target.view, target.version)
    if state not in ("building", "published"):
        event = record(
            lake, target.view, target.version, "building", f"build of {len(plan.intervals)} h"
        )
        registry = registry.with_event(event)
    runs = []
    if plan.intervals:
        if spark is None:
            raise ValueError("a SparkSession is needed to build intervals")
        job = BatchJob(spark, lake, registry=registry, metrics=metrics)
        for interval in plan.intervals:
            on_interval(interval)
            runs.append(job.run(interval, definition=target, replay=replay))
            on_run(runs[-1])
    if state != "published" and not missing(lake, target, registry).intervals:
        record(lake, target.view, target.version, "ready", "covers what the published version does")
    return runs


def replay_and_build(  # noqa: PLR0913 - keyword-only options of a build
    spark: SparkSession,
    lake: LakeSettings,
    kafka: KafkaSettings,
    target: Definition,
    *,
    on_plan: Callable[[BuildPlan], None] = lambda plan: None,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_run: Callable[[BatchRun], None] = lambda done: None,
    metrics: MetricsSettings | None = None,
) -> tuple[BuildPlan, list[BatchRun]]:
    """A Kappa build: a second archiving query replays the event topic from its earliest
    offset (AvailableNow, a checkpoint of its own) into a private master dataset, then the
    batch job builds ``target`` from it, hour by hour, over the published version's history
    that the retained log holds. Coverage records the master/events version from before the
    replay began: the replay holds at least what it held, so later arrivals still mark buckets
    stale."""

    from master_dataset.archiver import run as archive
    from master_dataset.settings import ArchiverSettings
    from runtime.offsets import topic_offsets

    events, store = MASTER_EVENTS.path(lake), lake.object_store
    before = open_delta(events, store).version() if is_delta(events, store) else -1
    private = replay_lake(lake, target)
    settings = ArchiverSettings(starting_offsets="earliest")
    truncated = any(o.earliest > 0 for o in topic_offsets(kafka, kafka.topic))
    archive(spark, kafka=kafka, lake=private, settings=settings, available_now=True)
    # With nothing deleted by retention the log holds the whole history; else only the hours
    # from its first retained record on are complete.
    since = replayed_since(private) if truncated else None
    if truncated and since is None:
        since = LATEST  # nothing retained: nothing to build
    plan = plan_build(lake, target, since=since)
    on_plan(plan)
    replay = Replay(MASTER_EVENTS.path(private), before)
    runs = build(
        spark, lake, plan, on_interval=on_interval, on_run=on_run, replay=replay, metrics=metrics
    )
    return plan, runs
