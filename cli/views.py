"""`ctr views`: versions of a view — list, build, diff, publish, rollback."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from cli.console import check_kafka_login, console, fail, progress_bar
from cli.tables import Column, Json, Listing, Wide, minute, one_output, print_json, print_table

if TYPE_CHECKING:
    from lake.registry import RegistryEvent
    from lake.settings import LakeSettings
    from serving_layer.inventory import VersionInfo
    from views.definitions import Definition

app = typer.Typer(
    help="Versions of a view: each a definition in code with tables of its own; one is published "
    "(what the API, the SQL sandbox and the dashboard read). Build a new version from the "
    "master dataset, compare it, publish it, roll back.",
    no_args_is_help=True,
)

View = Annotated[str, typer.Argument(metavar="VIEW", help="The view (today: ctr).")]


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
def list_versions(view: View = "ctr", wide: Wide = False, as_json: Json = False) -> None:
    """Every version of VIEW: its definition, state, coverage, runs and rows; then the last
    publishes and rollbacks (--json: all of them)."""
    from lake.settings import LakeSettings
    from serving_layer.inventory import Inventory
    from serving_layer.reader import SnapshotReader

    one_output(as_json, wide)
    _definition(view, 1)
    serving = SnapshotReader(LakeSettings(), refresh_s=0)
    try:
        snap = serving.snapshot()
        registry = serving.registry(snap)
        inventory = Inventory(serving)
        infos = [inventory.version_info(snap, d, registry) for d in _versions(view)]
    finally:
        serving.close()
    history = registry.history(view)
    if as_json:
        print_json(versions_record(view, infos, history))
        return
    print_table(versions_listing(infos), console, wide=wide)
    for event in history[-5:]:
        console.print(
            f"{event.at:%Y-%m-%d %H:%M:%S} UTC  v{event.version} {event.event}: {event.reason}"
        )


def versions_listing(infos: Sequence[VersionInfo]) -> Listing:
    """``ctr views list``'s table: a row per version."""
    listing = Listing(
        Column("version", whole=True, justify="right"),
        Column("state", whole=True),
        "definition",
        "covered",
        Column("runs", whole=True, justify="right"),
        Column("rows", whole=True, justify="right"),
        caption="times in UTC",
    )
    for info in infos:
        covered = (
            f"{minute(info.covered_intervals[0].start)} – {minute(info.covered_intervals[-1].end)} "
            f"({len(info.covered_intervals)} interval(s))"
            if info.covered_intervals
            else "nothing"
        )
        summary = info.summary + (f" [where {info.where}]" if info.where else "")
        listing.add_row(
            str(info.version), info.state, summary, covered, f"{info.runs:,}", f"{info.rows:,}"
        )
    return listing


def versions_record(
    view: str, infos: Sequence[VersionInfo], history: Sequence[RegistryEvent]
) -> dict[str, object]:
    """``ctr views list --json``: every version, and every publish and rollback."""
    return {
        "view": view,
        "versions": [
            {
                "version": info.version,
                "state": info.state,
                "definition": info.summary,
                "where": info.where,
                "covered_intervals": [
                    {"start": i.start, "end": i.end} for i in info.covered_intervals
                ],
                "runs": info.runs,
                "rows": info.rows,
            }
            for info in infos
        ],
        "history": [
            {"at": e.at, "version": e.version, "event": e.event, "reason": e.reason}
            for e in history
        ],
    }


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
    from lake.settings import LakeSettings
    from runtime.metrics import MetricsSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings
    from workflows.build import build as build_version
    from workflows.build import plan_build

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
    spark = (
        spark_session(SparkSettings(), lake.object_store, batch=True) if plan.intervals else None
    )
    with progress_bar("hours", total_known=True) as bar:
        task = bar.add_task("building", total=len(plan.intervals))
        try:
            build_version(
                spark,
                lake,
                plan,
                on_interval=lambda i: bar.update(task, description=f"{i.start:%Y-%m-%d %H:%M}"),
                on_run=lambda _: bar.advance(task),
                metrics=MetricsSettings(),
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
    from runtime.metrics import MetricsSettings
    from runtime.spark import spark_session
    from runtime.spark_settings import SparkSettings
    from workflows.build import replay_and_build

    kafka = KafkaSettings()
    check_kafka_login(kafka)
    spark = spark_session(SparkSettings(), lake.object_store, batch=True)
    console.print(f"{target.key}: replaying the event topic from its earliest offset ...")
    with progress_bar("hours", total_known=True) as bar:
        task = bar.add_task("replaying", total=None)
        try:
            plan, _ = replay_and_build(
                spark,
                lake,
                kafka,
                target,
                on_plan=lambda plan: bar.update(
                    task, description="building", total=len(plan.intervals)
                ),
                on_interval=lambda i: bar.update(task, description=f"{i.start:%Y-%m-%d %H:%M}"),
                on_run=lambda _: bar.advance(task),
                metrics=MetricsSettings(),
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


def _state(lake: LakeSettings, target: Definition) -> str:
    from lake.registry import read_registry

    return read_registry(lake).state(target.view, target.version)


@app.command()
def diff(
    view: View,
    a: Annotated[int, typer.Argument(metavar="A", help="Version A (e.g. the published one).")],
    b: Annotated[int, typer.Argument(metavar="B", help="Version B.")],
    start: Annotated[str | None, typer.Option(help="From (ISO-8601 UTC); default: all.")] = None,
    end: Annotated[str | None, typer.Option(help="To (exclusive); default: all.")] = None,
    wide: Wide = False,
    as_json: Json = False,
) -> None:
    """What switching readers from version A to version B of VIEW would change: per minute
    bucket and dimensions, the merged answers of both (batch rows where covered, speed rows
    elsewhere, each version's own definition); a summary and the largest changes."""
    from cli.comparison import print_comparison
    from lake.settings import LakeSettings
    from workflows.publish import diff as diff_versions

    one_output(as_json, wide)
    result = diff_versions(
        LakeSettings(),
        _definition(view, a),
        _definition(view, b),
        start=_time(start, "start"),
        end=_time(end, "end"),
    )
    if as_json:
        print_json(result.summary())
    else:
        print_comparison(result, console, wide=wide)


@app.command()
def publish(
    view: View,
    version: Annotated[
        int, typer.Argument(metavar="VERSION", help="The version readers switch to.")
    ],
    reason: Annotated[str, typer.Option(help="Why (recorded in the registry).")],
    force: Annotated[
        bool, typer.Option(help="Publish even if the version has not caught up.")
    ] = False,
) -> None:
    """Switch every reader (API, SQL sandbox, dashboard) of VIEW to VERSION at once: one commit
    to views/registry, recorded with the time and the reason. Refused while the version does
    not cover everything the published version covers (run `ctr views build` again), unless
    --force."""
    from lake.settings import LakeSettings
    from workflows.publish import NotCaughtUpError
    from workflows.publish import publish as publish_version

    try:
        switch = publish_version(LakeSettings(), _definition(view, version), reason, force=force)
    except NotCaughtUpError as exc:
        fail(f"{exc} (or --force)")
    if switch.event is None:
        console.print(f"{switch.target.key} is already published")
        return
    console.print(
        f"published {switch.target.key} at {switch.event.at:%Y-%m-%d %H:%M:%S} UTC "
        f"(was v{switch.previous.version})"
    )


@app.command()
def rollback(
    view: View,
    reason: Annotated[str, typer.Option(help="Why (recorded in the registry).")],
) -> None:
    """Publish again the version of VIEW that was published before the current one."""
    from lake.settings import LakeSettings
    from workflows.publish import rollback as roll_back

    _definition(view, 1)
    switch = roll_back(LakeSettings(), view, reason)
    if switch is None or switch.event is None:
        fail(f"{view}: nothing to roll back to (only one version was ever published)")
    console.print(
        f"rolled back {view} to v{switch.target.version} at "
        f"{switch.event.at:%Y-%m-%d %H:%M:%S} UTC (was v{switch.previous.version})"
    )
