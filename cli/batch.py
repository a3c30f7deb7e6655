"""`ctr batch` and `ctr backfill`: recompute exact views for an interval."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from batch_layer.interval import Interval, IntervalError
from cli.console import console, progress_bar
from cli.tables import Column, Listing, minute, one_output, print_json, print_table
from lake.settings import LakeSettings
from runtime.metrics import MetricsSettings
from runtime.spark_settings import SparkSettings

if TYPE_CHECKING:
    from views.comparison import Comparison


def _interval(start: str, end: str, names: tuple[str, str]) -> Interval:
    try:
        return Interval.parse(start, end, names=names)
    except IntervalError as exc:
        raise typer.BadParameter(str(exc)) from None


UNSETTLED_HELP = (
    "Cover the newest minutes too, those the published version has not settled (version 3: "
    "the last 70 min, clicks still arriving): they turn stale as on-time events arrive. "
    "Without it they are left to the speed layer and a later run."
)


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
    unsettled: Annotated[bool, typer.Option("--unsettled", help=UNSETTLED_HELP)] = False,
    pause_after: Annotated[
        str | None,
        typer.Option(
            hidden=True,
            help="Stop this process (SIGSTOP) right after it prints a step containing TEXT: "
            "the fault tests' kill point, which a kill sent on seeing the line could overtake.",
        ),
    ] = None,
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
    from runtime.spark import spark_session
    from workflows.batch import recompute

    interval = _interval(start, end, ("--start", "--end"))
    lake = LakeSettings()
    spark = spark_session(SparkSettings(), lake.object_store, batch=True)
    on_step = _pausing(console.print, pause_after) if pause_after else console.print
    runs = recompute(
        spark, lake, [interval], on_step=on_step, unsettled=unsettled, metrics=MetricsSettings()
    )
    for result in runs:
        console.print(
            f"done: run {result.run_id}, {result.rows_written:,} rows for {result.interval}"
        )


def _pausing(print_step: Callable[[str], None], text: str) -> Callable[[str], None]:
    """``print_step`` that stops the process once it has printed a step containing ``text``
    (the caller then kills or continues it): nothing after the step's line has run."""

    def on_step(step: str) -> None:
        print_step(step)
        if text in step:
            os.kill(os.getpid(), signal.SIGSTOP)

    return on_step


def _recompute_stale() -> None:
    from runtime.spark import spark_session
    from workflows.stale import plan, recompute

    lake = LakeSettings()
    stale = plan(lake)
    if not stale.intervals:
        console.print("nothing is stale: every covered minute is exact")
        return
    console.print(
        f"{stale.buckets:,} stale minute(s) with {stale.events:,} late event(s); recomputing "
        f"{len(stale.intervals)} interval(s)"
    )
    spark = spark_session(SparkSettings(), lake.object_store, batch=True)
    with progress_bar("intervals", total_known=True) as bar:
        task = bar.add_task("recomputing", total=len(stale.intervals))

        def show(interval: Interval) -> None:
            bar.update(task, description=f"{interval.start:%Y-%m-%d %H:%M}")

        runs = recompute(
            spark,
            lake,
            stale,
            on_interval=show,
            on_run=lambda _: bar.advance(task),
            metrics=MetricsSettings(),
        )
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
    unsettled: Annotated[bool, typer.Option("--unsettled", help=UNSETTLED_HELP)] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="With --preview: the tables at the width they need.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="With --preview: one JSON document on stdout instead of the tables (each "
            "hour's comparison and the whole's, as `ctr views diff --json`).",
        ),
    ] = False,
) -> None:
    """Run the batch job hour by hour over [FROM, TO), without Airflow, with a progress bar.

    It recomputes the published version of the view. With Airflow running, prefer
    `airflow backfill create --dag-id ctr_batch ...` (its `preview` param is --preview).
    """
    from runtime.spark import spark_session
    from workflows.batch import previews, recompute

    one_output(as_json, wide)
    if (as_json or wide) and not preview:
        raise typer.BadParameter(
            "only with --preview (a backfill prints no table)",
            param_hint="--json" if as_json else "--wide",
        )
    interval = _interval(start, end, ("--from", "--to"))
    hours = list(interval.hours())
    lake = LakeSettings()
    spark = spark_session(SparkSettings(), lake.object_store, batch=True)
    with progress_bar("hours", total_known=True) as bar:
        task = bar.add_task("previewing" if preview else "backfilling", total=len(hours))

        def show(hour: Interval) -> None:
            bar.update(task, description=f"{hour.start:%Y-%m-%d %H:%M}")

        def done(_: Interval) -> None:
            bar.advance(task)

        if preview:
            found = previews(spark, lake, hours, on_interval=show, on_done=done)
        else:
            runs = recompute(
                spark,
                lake,
                hours,
                on_interval=show,
                on_done=done,
                on_unsettled=bar.console.print,
                unsettled=unsettled,
                metrics=MetricsSettings(),
            )
    if preview:
        _print_previews(found, as_json=as_json, wide=wide)
        return
    rows = sum(r.rows_written for r in runs)
    view = runs[0].view if runs else "ctr"
    console.print(
        f"backfilled {len(runs)} of {len(hours)} hour(s) of {interval} ({view}): {rows:,} rows"
    )


def _print_previews(found: list[Comparison], *, as_json: bool, wide: bool) -> None:
    from cli.comparison import print_comparison
    from views.comparison import combined

    whole = combined(found, largest=5)
    if as_json:
        print_json({"hours": [p.summary() for p in found], "combined": whole.summary()})
        return
    print_table(previews_listing(found), console, wide=wide)
    print_comparison(whole, console, wide=wide)
    console.print("nothing was replaced (run without --preview to recompute)")


def previews_listing(found: list[Comparison]) -> Listing:
    """``ctr backfill --preview``'s table: a row per hour."""
    from cli.comparison import change

    listing = Listing(
        Column("hour", whole=True),
        Column("rows changed", justify="right"),
        Column("impressions now -> after", justify="right"),
        Column("clicks now -> after", justify="right"),
        caption="times in UTC",
    )
    for p in found:
        listing.add_row(
            minute(p.start),
            f"{p.rows_changed:,} of {p.rows_compared:,}",
            change(p.impressions),
            change(p.clicks),
        )
    return listing
