"""Recompute what is stale: the covered hours that received events after the run that covered
them (:mod:`lake.staleness`), each with the batch job, until none is left.

Used by `ctr batch --stale` and by the ``ctr_recompute_stale`` DAG. Idempotent: what a run made
exact is not stale any more, so a second call finds nothing; the batch job's run ids are keyed
by interval and input version, so a retried run rewrites identical rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from batch_layer.job import BatchRun, run
from lake.settings import LakeSettings
from lake.staleness import read_stale, recompute_intervals

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class StalePlan:
    """What is stale now and the intervals that make it exact again."""

    buckets: int
    events: int
    intervals: tuple[Interval, ...]


def plan(lake: LakeSettings) -> StalePlan:
    """The stale buckets and the intervals to recompute, read without Spark (cheap enough for
    an Airflow check every few minutes)."""
    buckets, coverage = read_stale(lake)
    intervals = tuple(Interval(s, e) for s, e in recompute_intervals(buckets, coverage))
    return StalePlan(len(buckets), sum(b.events for b in buckets), intervals)


def recompute(
    spark: SparkSession,
    lake: LakeSettings,
    stale: StalePlan,
    *,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_run: Callable[[BatchRun], None] = lambda done: None,
) -> list[BatchRun]:
    """Run the batch job over every interval of ``stale`` (``on_interval`` before each,
    ``on_run`` after); returns the runs."""
    runs = []
    for interval in stale.intervals:
        on_interval(interval)
        runs.append(run(spark, interval, lake=lake))
        on_run(runs[-1])
    return runs
