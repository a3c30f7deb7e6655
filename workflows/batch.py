"""Recomputing the exact view over intervals: one interval (`ctr batch`, the ``ctr_batch``
task), hour by hour (`ctr backfill`), or a preview of what that would change, replacing
nothing (`ctr backfill --preview`, ``ctr_batch``'s ``preview`` param).

Every function recomputes the published version of the view, read once per call with the
registry the batch job then keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from batch_layer.job import BatchJob, BatchRun
from batch_layer.preview import preview
from lake.registry import read_registry
from lake.settings import LakeSettings
from views.comparison import Comparison

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def recompute(
    spark: SparkSession,
    lake: LakeSettings,
    intervals: Iterable[Interval],
    *,
    run_id: str | None = None,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_done: Callable[[Interval], None] = lambda interval: None,
    on_step: Callable[[str], None] = lambda step: None,
) -> list[BatchRun]:
    """Run the batch job over each of ``intervals`` in turn (``on_interval`` before each,
    ``on_done`` after; ``run_id``: for a single one, the id to record, e.g. Airflow's)."""
    todo = list(intervals)
    if run_id is not None and len(todo) != 1:
        raise ValueError(f"a run id names one interval's run, got {len(todo)} intervals")
    job = BatchJob(spark, lake, on_step=on_step)
    runs = []
    for interval in todo:
        on_interval(interval)
        runs.append(job.run(interval, run_id=run_id))
        on_done(interval)
    return runs


def previews(
    spark: SparkSession,
    lake: LakeSettings,
    intervals: Iterable[Interval],
    *,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_done: Callable[[Interval], None] = lambda interval: None,
) -> list[Comparison]:
    """What recomputing each of ``intervals`` would change, one comparison each."""
    view = read_registry(lake).published("ctr")
    found = []
    for interval in intervals:
        on_interval(interval)
        found.append(preview(spark, interval, lake=lake, definition=view))
        on_done(interval)
    return found
