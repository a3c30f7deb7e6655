"""`ctr batch` and `ctr backfill`: recompute exact views for an interval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from batch_layer.interval import Interval, IntervalError
from cli.console import console, fail, progress_bar
from lake.settings import LakeSettings
from runtime.spark_settings import SparkSettings

if TYPE_CHECKING:
    from batch_layer.preview import Preview


def _interval(start: str, end: str) -> Interval:
    try:
        return Interval.parse(start, end)
    except IntervalError as exc:
        raise typer.BadParameter(str(exc)) from None


def batch(
    start: Annotated[
        str | None, typer.Option(help="Interval start, ISO-8601 UTC, whole minute.")
    ] = None,
    end: Annotated[
        str | None, typer.Option(help="Interval end (exclusive), after --start.")
    ] = None,
    stale: Annotated[
        bool,
        typer.Option(
            "--stale",
            help="Instead of an interval: recompute every covered hour that received events "
            "after the run that covered it (see `GET /api/v1/views` stale_intervals), then exit.",
        ),
    ] = False,
) -> None:
    """Recompute batch/ctr for [START, END) from master/events, exactly (deduplicated).

    Replaces that interval of batch/ctr in one atomic commit, then records it in
    batch/coverage. Safe to rerun. With --stale, recomputes what late events made stale
    (nothing stale: says so and exits 0).
    """
    if stale:
        if start is not None or end is not None:
            raise typer.BadParameter("give either --stale or --start/--end, not both")
        _recompute_stale()
        return
    if start is None or end is None:
        raise typer.BadParameter("--start and --end are required (or --stale)")
    from batch_layer.job import MissingTableError, run
    from runtime.spark import spark_session

    interval = _interval(start, end)
    spark = spark_session(SparkSettings())
    try:
        result = run(spark, interval, lake=LakeSettings(), on_step=console.print)
    except MissingTableError as exc:
        fail(str(exc))
    console.print(f"done: run {result.run_id}, {result.rows_written:,} rows for {interval}")


def _recompute_stale() -> None:
    from batch_layer.job import MissingTableError
    from batch_layer.stale import plan, recompute
    from runtime.spark import spark_session

    lake = LakeSettings()
    stale = plan(lake)
    if not stale.intervals:
        console.print("nothing is stale: every covered minute is exact")
        return
    console.print(
        f"{stale.buckets:,} stale minute(s) with {stale.events:,} late event(s); recomputing "
        f"{len(stale.intervals)} interval(s)"
    )
    spark = spark_session(SparkSettings())
    with progress_bar("intervals", total_known=True) as bar:
        task = bar.add_task("recomputing", total=len(stale.intervals))

        def show(interval: Interval) -> None:
            bar.update(task, description=f"{interval.start:%Y-%m-%d %H:%M}")

        try:
            runs = recompute(
                spark, lake, stale, on_interval=show, on_run=lambda _: bar.advance(task)
            )
        except MissingTableError as exc:
            fail(str(exc))
    for done in runs:
        console.print(f"done: run {done.run_id}, {done.rows_written:,} rows for {done.interval}")
    left = plan(lake)
    if left.intervals:
        console.print(
            f"{left.buckets:,} minute(s) turned stale meanwhile (events still arriving): "
            "run again, or let the ctr_recompute_stale DAG pick them up"
        )


def backfill(
    start: Annotated[str, typer.Option("--from", help="First hour, ISO-8601 UTC.")],
    end: Annotated[str, typer.Option("--to", help="End (exclusive), ISO-8601 UTC.")],
    preview: Annotated[
        bool,
        typer.Option(
            "--preview",
            help="Replace nothing: show, hour by hour, what the recompute would change "
            "(rows, impressions, clicks, the largest changes).",
        ),
    ] = False,
) -> None:
    """Run the batch job hour by hour over [FROM, TO), without Airflow, with a progress bar.

    It recomputes the published version of the view. With Airflow running, prefer
    `airflow backfill create --dag-id ctr_batch ...` (its `preview` param is --preview).
    """
    from batch_layer.job import MissingTableError, run
    from lake.registry import read_registry
    from runtime.spark import spark_session

    interval = _interval(start, end)
    hours = list(interval.hours())
    spark = spark_session(SparkSettings())
    lake = LakeSettings()
    view = read_registry(lake).published("ctr")
    rows = 0
    previews = []
    with progress_bar("hours", total_known=True) as bar:
        task = bar.add_task("previewing" if preview else "backfilling", total=len(hours))
        for hour in hours:
            bar.update(task, description=f"{hour.start:%Y-%m-%d %H:%M}")
            try:
                if preview:
                    from batch_layer.preview import preview as preview_hour

                    previews.append(preview_hour(spark, hour, lake=lake, definition=view))
                else:
                    rows += run(spark, hour, lake=lake, definition=view).rows_written
            except MissingTableError as exc:
                fail(str(exc))
            bar.advance(task)
    if preview:
        _print_previews(previews)
        return
    console.print(f"backfilled {len(hours)} hour(s) of {interval} ({view.key}): {rows:,} rows")


def _print_previews(previews: list[Preview]) -> None:
    from rich.table import Table

    table = Table("hour (UTC)", "rows changed", "impressions now -> after", "clicks now -> after")
    for p in previews:
        (i_now, i_after), (c_now, c_after) = p.impressions, p.clicks
        table.add_row(
            f"{p.interval.start:%Y-%m-%d %H:%M}",
            f"{p.rows_changed:,} of {p.rows_compared:,}",
            f"{i_now:,} -> {i_after:,} ({i_after - i_now:+,})",
            f"{c_now:,} -> {c_after:,} ({c_after - c_now:+,})",
        )
    console.print(table)
    largest = sorted(
        (change for p in previews for change in p.largest),
        key=lambda c: -(abs(c[2][1] - c[2][0]) + abs(c[3][1] - c[3][0])),
    )[:5]
    for bucket, dims, impressions, clicks in largest:
        console.print(
            f"  {bucket:%Y-%m-%d %H:%M} {' '.join(dims.values())}: impressions "
            f"{impressions[0]:,} -> {impressions[1]:,}, clicks {clicks[0]:,} -> {clicks[1]:,}"
        )
    console.print("nothing was replaced (run without --preview to recompute)")
