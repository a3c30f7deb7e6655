"""Recomputing the exact view over intervals: one interval (`ctr batch`, the ``ctr_batch``
task), hour by hour (`ctr backfill`), or a preview of what that would change, replacing
nothing (`ctr backfill --preview`, ``ctr_batch``'s ``preview`` param).

Every function recomputes the published version of the view, read once per call with the
registry the batch job then keeps.
"""

from __future__ import annotations

import datetime as dt
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

    from runtime.metrics import MetricsSettings


def recompute(  # noqa: PLR0913 - keyword-only options of a recompute
    spark: SparkSession,
    lake: LakeSettings,
    intervals: Iterable[Interval],
    *,
    run_id: str | None = None,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_done: Callable[[Interval], None] = lambda interval: None,
    on_step: Callable[[str], None] = lambda step: None,
    unsettled: bool = False,
    on_unsettled: Callable[[str], None] | None = None,
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    metrics: MetricsSettings | None = None,
) -> list[BatchRun]:
    """Run the batch job over each of ``intervals`` in turn (``on_interval`` before each,
    ``on_done`` after; ``run_id``: for a single one, the id to record, e.g. Airflow's).

    Only the minutes the published version has settled at ``clock()`` are covered
    (:meth:`views.definitions.Definition.settled_before`): the rest of an interval is left to
    the speed layer and a later run (``on_unsettled``, default ``on_step``, says so), an
    interval with none is skipped.
    ``unsettled`` covers them too (they turn stale as on-time events arrive). Each run's
    figures are pushed to ``metrics``' Pushgateway."""
    todo = list(intervals)
    if run_id is not None and len(todo) != 1:
        raise ValueError(f"a run id names one interval's run, got {len(todo)} intervals")
    job = BatchJob(spark, lake, on_step=on_step, metrics=metrics)
    view = job.registry.published("ctr")
    edge = view.settled_before(clock())
    runs = []
    for interval in todo:
        on_interval(interval)
        settled = interval if unsettled else interval.before(edge)
        if settled != interval:
            (on_unsettled or on_step)(
                _unsettled_note(interval, settled, edge, view.settle, view.version)
            )
        if settled is not None:
            runs.append(job.run(settled, run_id=run_id))
        on_done(interval)
    return runs


def _unsettled_note(
    interval: Interval,
    settled: Interval | None,
    edge: dt.datetime,
    settle: dt.timedelta,
    version: int,
) -> str:
    minutes = int(settle.total_seconds() // 60)
    why = (
        f"version {version} of ctr settles {minutes} min after a minute (on-time clicks and "
        f"events still change it until then); the speed layer serves the minutes from "
        f"{edge:%Y-%m-%d %H:%M} UTC, a later run covers them (--unsettled covers them now)"
    )
    if settled is None:
        return f"skipped {interval}: nothing in it has settled: {why}"
    return f"covering {settled} of {interval}: {why}"


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
