"""Recompute what is stale: the covered hours that received events after the run that covered
them (:mod:`lake.coverage.staleness`), each with the batch job, until none is left.

Used by `ctr batch --stale` and by the ``ctr_recompute_stale`` DAG. Idempotent: what a run made
exact is not stale any more, so a second call finds nothing; the batch job's run ids are keyed
by interval and input version, so a retried run rewrites identical rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from batch_layer.job import BatchJob, BatchRun
from lake.coverage.log import read_runs
from lake.coverage.staleness import read_stale, recompute_intervals
from lake.registry import Registry, read_registry
from lake.settings import LakeSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from runtime.metrics import MetricsSettings


@dataclass(frozen=True)
class StalePlan:
    """What is stale now and the intervals that make it exact again, with the registry it was
    planned from."""

    buckets: int
    events: int
    intervals: tuple[Interval, ...]
    registry: Registry | None = None


def plan(lake: LakeSettings) -> StalePlan:
    """The stale buckets of the published version and the intervals to recompute, read
    without Spark (cheap enough for an Airflow check every few minutes)."""
    registry = read_registry(lake)
    view = registry.published("ctr")
    runs = read_runs(lake)
    buckets = read_stale(lake, view, runs)
    intervals = tuple(Interval(s, e) for s, e in recompute_intervals(buckets, runs.of(view.key)))
    return StalePlan(len(buckets), sum(b.events for b in buckets), intervals, registry)


def recompute(
    spark: SparkSession,
    lake: LakeSettings,
    stale: StalePlan,
    *,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_run: Callable[[BatchRun], None] = lambda done: None,
    metrics: MetricsSettings | None = None,
) -> list[BatchRun]:
    """Run the batch job over every interval of ``stale`` (``on_interval`` before each,
    ``on_run`` after; each run's figures pushed to ``metrics``' Pushgateway); returns the runs."""
    job = BatchJob(spark, lake, registry=stale.registry, metrics=metrics)
    runs = []
    for interval in stale.intervals:
        on_interval(interval)
        runs.append(job.run(interval))
        on_run(runs[-1])
    return runs
