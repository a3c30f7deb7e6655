"""`ctr views`: versions of a view — list, build, diff, publish, rollback."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated

import typer

from cli.console import console, fail, progress_bar

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

    from batch_layer.interval import Interval
    from batch_layer.job import BatchRun
    from batch_layer.reprocess import BuildPlan
    from lake.settings import LakeSettings
    from runtime.kafka_settings import KafkaSettings
    from serving_layer.diff import Diff
    from views.definitions import Definition

app = typer.Typer(
    help="Versions of a view: each a definition in code with tables of its own; one is published "
    "(what the API, the SQL sandbox and the dashboard read). Build a new version from the "
    "master dataset, compare it, publish it, roll back.",
    no_args_is_help=True,
)

View = Annotated[str, typer.Argument(help="The view (today: ctr).")]


def _definition(view: str, version: int) -> Definition:
    from views.definitions import UnknownVersionError, definition

    try:
        return definition(view, version)
    except UnknownVersionError as exc:
        raise typer.BadParameter(str(exc)) from None


def _time(value: str | None, name: str) -> dt.datetime | None:
    from batch_layer.interval import IntervalError, parse_time

    if value is None:
        return None
    try:
        return parse_time(value, name)
    except IntervalError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"--{name}") from None


@app.command("list")
def list_versions(view: View = "ctr") -> None:
    """Every version of VIEW: its definition, state, coverage, runs and rows."""
    from rich.table import Table

    from lake.settings import LakeSettings
    from serving_layer.service import ServingLayer

    _definition(view, 1)
    serving = ServingLayer(LakeSettings(), refresh_s=0)
    try:
        snap = serving.snapshot()
        registry = serving.registry(snap)
        table = Table("version", "state", "definition", "covered", "runs", "rows")
        for info in (serving.version_info(snap, d, registry) for d in _versions(view)):
            covered = (
                f"{info.covered_intervals[0].start:%Y-%m-%d %H:%M} – "
                f"{info.covered_intervals[-1].end:%Y-%m-%d %H:%M} UTC "
                f"({len(info.covered_intervals)} interval(s))"
                if info.covered_intervals
                else "nothing"
            )
            summary = info.summary + (f" [where {info.where}]" if info.where else "")
            table.add_row(
                str(info.version), info.state, summary, covered, f"{info.runs:,}", f"{info.rows:,}"
            )
        console.print(table)
        for event in registry.history(view)[-5:]:
            console.print(
                f"{event.at:%Y-%m-%d %H:%M:%S} UTC  v{event.version} {event.event}: {event.reason}"
            )
    finally:
        serving.close()


def _versions(view: str) -> tuple[Definition, ...]:
    from views.definitions import versions

    return versions(view)


@app.command()
def build(
    view: View,
    version: Annotated[int, typer.Option(help="The version to build (defined in code).")],
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="Where the history comes from: master (master/events), or kafka (the retained "
            "log, replayed from its earliest offset by a second archiving query).",
        ),
    ] = "master",
) -> None:
    """Recompute VIEW's version N over all the history the published version covers, hour by
    hour, into the version's own table; the published version keeps serving meanwhile.
    Resumable: hours already built are skipped, so run it again after an interruption or to
    catch up with hours covered since. With --from kafka (Kappa-style), hours before the
    retained log begins are left out (build them --from master)."""
    from batch_layer.job import MissingTableError
    from batch_layer.reprocess import build as build_version
    from batch_layer.reprocess import plan_build
    from lake.settings import LakeSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings

    if source not in ("master", "kafka"):
        raise typer.BadParameter(f"{source!r}: one of master, kafka", param_hint="--from")
    target = _definition(view, version)
    lake = LakeSettings()
    if source == "kafka":
        _build_from_kafka(lake, target)
        return
    plan = plan_build(lake, target)
    console.print(
        f"{target.key}: {target.summary}; {len(plan.done)} hour(s) built, "
        f"{len(plan.intervals)} to build (the published version is v{plan.published.version})"
    )
    spark = spark_session(SparkSettings()) if plan.intervals else None
    with progress_bar("hours", total_known=True) as bar:
        task = bar.add_task("building", total=len(plan.intervals))
        try:
            build_version(
                spark,
                lake,
                plan,
                on_interval=lambda i: bar.update(task, description=f"{i.start:%Y-%m-%d %H:%M}"),
                on_run=lambda _: bar.advance(task),
            )
        except MissingTableError as exc:
            fail(str(exc))
    state = _state(lake, target)
    console.print(
        f"{target.key} is {state}"
        + ("; publish it with `ctr views publish`" if state == "ready" else "")
    )


def _build_from_kafka(lake: LakeSettings, target: Definition) -> None:
    from batch_layer.job import MissingTableError
    from runtime.kafka_settings import KafkaSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings

    spark = spark_session(SparkSettings())
    console.print(f"{target.key}: replaying the event topic from its earliest offset ...")
    with progress_bar("hours", total_known=True) as bar:
        task = bar.add_task("replaying", total=None)
        try:
            plan, _ = replay_and_build(
                spark,
                lake,
                KafkaSettings(),
                target,
                on_plan=lambda plan: bar.update(
                    task, description="building", total=len(plan.intervals)
                ),
                on_interval=lambda i: bar.update(task, description=f"{i.start:%Y-%m-%d %H:%M}"),
                on_run=lambda _: bar.advance(task),
            )
        except MissingTableError as exc:
            fail(str(exc))
    if plan.outside:
        console.print(
            f"{len(plan.outside)} hour(s) before the retained log begins were left out: build "
            f"them with `ctr views build {target.view} --version {target.version} --from master`"
        )
    state = _state(lake, target)
    console.print(f"{target.key} is {state}")


def replay_and_build(
    spark: SparkSession,
    lake: LakeSettings,
    kafka: KafkaSettings,
    target: Definition,
    *,
    on_plan: Callable[[BuildPlan], None] = lambda plan: None,
    on_interval: Callable[[Interval], None] = lambda interval: None,
    on_run: Callable[[BatchRun], None] = lambda done: None,
) -> tuple[BuildPlan, list[BatchRun]]:
    """A Kappa build: a second archiving query replays the event topic from its earliest
    offset (AvailableNow, a checkpoint of its own) into a private master dataset, then the
    batch job builds ``target`` from it, hour by hour, over the published version's history
    that the retained log holds. Coverage records the master/events version from before the
    replay began: the replay holds at least what it held, so later arrivals still mark buckets
    stale."""
    from deltalake import DeltaTable

    from batch_layer.job import Replay
    from batch_layer.reprocess import build, plan_build, replay_lake, replayed_since
    from master_dataset.archiver import run as archive
    from master_dataset.settings import ArchiverSettings
    from runtime.offsets import topic_offsets

    before = DeltaTable(lake.events).version() if DeltaTable.is_deltatable(lake.events) else -1
    private = replay_lake(lake, target)
    settings = ArchiverSettings(starting_offsets="earliest")
    truncated = any(o.earliest > 0 for o in topic_offsets(kafka, kafka.topic))
    archive(spark, kafka=kafka, lake=private, settings=settings, available_now=True)
    # With nothing deleted by retention the log holds the whole history; else only the hours
    # from its first retained record on are complete.
    since = replayed_since(private) if truncated else None
    if truncated and since is None:
        since = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)  # nothing retained: nothing to build
    plan = plan_build(lake, target, since=since)
    on_plan(plan)
    replay = Replay(private.events, before)
    runs = build(spark, lake, plan, on_interval=on_interval, on_run=on_run, replay=replay)
    return plan, runs


def _state(lake: LakeSettings, target: Definition) -> str:
    from lake.registry import read_registry

    return read_registry(lake).state(target.view, target.version)


@app.command()
def diff(
    view: View,
    a: Annotated[int, typer.Argument(help="Version A (e.g. the published one).")],
    b: Annotated[int, typer.Argument(help="Version B.")],
    start: Annotated[str | None, typer.Option(help="From (ISO-8601 UTC); default: all.")] = None,
    end: Annotated[str | None, typer.Option(help="To (exclusive); default: all.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
) -> None:
    """What switching readers from version A to version B of VIEW would change: per minute
    bucket and dimensions, the merged answers of both (batch rows where covered, speed rows
    elsewhere, each version's own definition); a summary and the largest changes."""
    from lake.settings import LakeSettings
    from serving_layer.diff import diff_versions
    from serving_layer.service import ServingLayer

    first, second = _definition(view, a), _definition(view, b)
    serving = ServingLayer(LakeSettings(), refresh_s=0)
    try:
        result = diff_versions(
            serving,
            first,
            second,
            start=_time(start, "start") or dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
            end=_time(end, "end") or dt.datetime(9999, 1, 1, tzinfo=dt.UTC),
        )
    finally:
        serving.close()
    if as_json:
        import json

        from serving_layer.diff import diff_summary

        typer.echo(json.dumps(diff_summary(result), default=str, indent=2))
    else:
        _print_diff(result)


def _print_diff(result: Diff) -> None:
    from rich.table import Table

    a, b = result.a.version, result.b.version
    console.print(
        f"{result.a.view} v{a} -> v{b}: {result.rows_changed:,} of {result.rows_compared:,} rows "
        f"(bucket x dimensions) change ({result.changed_fraction:.2%}); {result.only_in_a:,} only "
        f"in v{a}, {result.only_in_b:,} only in v{b}"
    )
    console.print(
        f"impressions {_change(result.impressions)}; clicks {_change(result.clicks)}; "
        f"raw clicks {_change(result.raw_clicks)}"
    )
    if result.a.attribution is not None or result.b.attribution is not None:
        # Only a version with click attribution counts these (the other side: "n/a").
        console.print(
            f"orphan clicks {_change(result.orphan_clicks)}; "
            f"repeat clicks {_change(result.repeat_clicks)}"
        )
    if result.largest:
        table = Table(
            "bucket (UTC)",
            "campaign",
            "ad",
            "site",
            "country",
            "device",
            "impressions",
            "clicks",
            "raw clicks",
        )
        for c in result.largest:
            table.add_row(
                f"{c.bucket_start:%Y-%m-%d %H:%M}",
                *(str(v) for v in c.dimensions.values()),
                _change(c.impressions, delta=False),
                _change(c.clicks, delta=False),
                _change(c.raw_clicks, delta=False),
            )
        console.print(table)


def _change(pair: tuple[int | None, int | None], *, delta: bool = True) -> str:
    """``a -> b (+d)``; a side without the count (no click attribution) is ``n/a``."""
    first, second = pair
    text = f"{_count(first)} -> {_count(second)}"
    if delta and first is not None and second is not None:
        text += f" ({second - first:+,})"
    return text


def _count(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


@app.command()
def publish(
    view: View,
    version: Annotated[int, typer.Argument(help="The version readers switch to.")],
    reason: Annotated[str, typer.Option(help="Why (recorded in the registry).")],
    force: Annotated[
        bool, typer.Option(help="Publish even if the version has not caught up.")
    ] = False,
) -> None:
    """Switch every reader (API, SQL sandbox, dashboard) of VIEW to VERSION at once: one commit
    to views/registry, recorded with the time and the reason. Refused while the version does
    not cover everything the published version covers (run `ctr views build` again), unless
    --force."""
    from batch_layer.reprocess import caught_up
    from lake.registry import read_registry, record
    from lake.settings import LakeSettings

    target = _definition(view, version)
    lake = LakeSettings()
    current = read_registry(lake).published(view)
    if current == target:
        console.print(f"{target.key} is already published")
        return
    missing = caught_up(lake, target)
    if missing.intervals and not force:
        first = missing.intervals[0]
        fail(
            f"{target.key} does not cover {len(missing.intervals)} interval(s) that "
            f"v{current.version} covers (from {first.start:%Y-%m-%d %H:%M} UTC): run `ctr views "
            f"build {view} --version {version}` first (or --force)"
        )
    event = record(lake, view, version, "published", reason)
    console.print(
        f"published {target.key} at {event.at:%Y-%m-%d %H:%M:%S} UTC (was v{current.version})"
    )


@app.command()
def rollback(
    view: View,
    reason: Annotated[str, typer.Option(help="Why (recorded in the registry).")],
) -> None:
    """Publish again the version of VIEW that was published before the current one."""
    from lake.registry import read_registry, record
    from lake.settings import LakeSettings

    _definition(view, 1)
    lake = LakeSettings()
    registry = read_registry(lake)
    current, previous = registry.published(view), registry.previous(view)
    if previous is None:
        fail(f"{view}: nothing to roll back to (v{current.version} is the only version published)")
    event = record(lake, view, previous.version, "published", f"rollback: {reason}")
    console.print(
        f"rolled back {view} to v{previous.version} at {event.at:%Y-%m-%d %H:%M:%S} UTC "
        f"(was v{current.version})"
    )
