"""`ctr alerts`: CTR alert rules — create, list, delete, test one now, and run the evaluator."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Final, NoReturn

import typer

from cli.console import console, fail
from cli.tables import Column, Json, Listing, Wide, minute, one_output, print_json, print_table

if TYPE_CHECKING:
    from alerts.evaluate import Finding
    from alerts.rules import Rule, RuleError

app = typer.Typer(
    help="CTR alerts that know statistics: a rule fires when a measure's change against its "
    "baseline is beyond chance at the rule's level and at least its minimum effect, never on "
    "a sample too small to tell. Rules live in the lake (alerts/rules); `ctr alerts run` "
    "evaluates them each minute and posts their alerts to webhooks.",
    no_args_is_help=True,
)

Name = Annotated[
    str, typer.Argument(metavar="NAME", help="The rule's name: 1 to 64 of A-Z a-z 0-9 . _ -.")
]
Owner = Annotated[
    str | None,
    typer.Option(
        help="The rule's owner (the key that made it; ctr: this command line), when several "
        "owners have a rule of that name."
    ),
]
# What each field of alerts.rules.Rule is called on this command line.
_OPTIONS: Final = {
    "name": "NAME",
    "where": "--where",
    "per": "--per",
    "window_minutes": "--window",
    "baseline": "--baseline",
    "baseline_days": "--baseline-days",
    "baseline_minutes": "--baseline-minutes",
    "min_trials": "--min-trials",
    "min_effect": "--min-effect",
    "webhook_url": "--webhook",
}


@app.command()
def create(
    name: Name,
    measure: Annotated[
        str,
        typer.Option(
            help="ctr (clicks / impressions), impressions or clicks (per minute), orphan_share "
            "(orphan clicks / raw clicks: a view with click attribution)."
        ),
    ] = "ctr",
    where: Annotated[
        str | None,
        typer.Option(help="The rows watched: DIMENSION=VALUE (campaign_id=cmp-7). Default: all."),
    ] = None,
    per: Annotated[
        str | None,
        typer.Option(
            help="Test each value of this dimension on its own (ad_id: one alert per ad), the "
            "false-alarm rate held over them all (Holm). Default: one test."
        ),
    ] = None,
    window: Annotated[
        int, typer.Option(help="Minutes of the window, the newest closed ones.")
    ] = 15,
    baseline: Annotated[
        str,
        typer.Option(
            help="days: the same window on each of --baseline-days days before (time of day "
            "alike); previous: the --baseline-minutes right before the window."
        ),
    ] = "days",
    baseline_days: Annotated[int, typer.Option(help="Days of a days baseline.")] = 7,
    baseline_minutes: Annotated[int, typer.Option(help="Minutes of a previous baseline.")] = 60,
    alpha: Annotated[
        float,
        typer.Option(
            help="Significance level: the chance of a false alarm per group and day (each "
            "test's p-value is corrected for the day's windows and the rule's groups)."
        ),
    ] = 0.01,
    min_effect: Annotated[
        float, typer.Option(help="Smallest relative change worth an alert (0.2: 20 %).")
    ] = 0.2,
    direction: Annotated[str, typer.Option(help="drop, rise or any.")] = "any",
    min_trials: Annotated[
        int,
        typer.Option(help="Impressions (raw clicks for orphan_share) the window needs first."),
    ] = 1000,
    webhook: Annotated[
        str | None, typer.Option(help="An http(s) URL its alerts are POSTed to, signed.")
    ] = None,
) -> None:
    """Create rule NAME. Its webhook secret is printed once, alone on the last line of stdout:
    a receiver checks X-Ctr-Signature with it."""
    from alerts.rules import Rule, RuleError
    from alerts.settings import AlertSettings
    from alerts.store import create_rule
    from lake.settings import LakeSettings

    try:
        rule = Rule.create(
            name=name,
            measure=measure,
            where=_where(where),
            per=per,
            window_minutes=window,
            baseline=baseline,
            baseline_days=baseline_days,
            baseline_minutes=baseline_minutes,
            alpha=alpha,
            min_effect=min_effect,
            direction=direction,
            min_trials=min_trials,
            webhook_url=webhook,
        )
        stored = create_rule(LakeSettings(), rule, AlertSettings())
    except RuleError as exc:
        _fail(exc)
    console.print(f"created rule {name!r}: {stored.describe()}")
    console.print("Its webhook secret, shown once, below:")
    typer.echo(stored.secret)


@app.command("list")
def list_rules(wide: Wide = False, as_json: Json = False) -> None:
    """The rules: name, what each watches and when it fires, its webhook, who made it. Every
    value is printed as text, control characters escaped (rules and webhooks are tenants')."""
    from alerts.store import read_rules
    from lake.settings import LakeSettings

    one_output(as_json, wide)
    rules = sorted(read_rules(LakeSettings()).values(), key=lambda r: (r.name, r.owner))
    if as_json:
        print_json({"rules": [rule_record(r) for r in rules]})
    elif not rules:
        console.print("no rules (ctr alerts create)")
    else:
        print_table(rules_listing(rules), console, wide=wide)


def rules_listing(rules: Sequence[Rule]) -> Listing:
    """``ctr alerts list``'s table."""
    listing = Listing(
        Column("name", whole=True),
        Column("owner", whole=True),
        "rule",
        "webhook",
        "created",
        caption="times in UTC",
    )
    for rule in rules:
        created = minute(rule.created_at) if rule.created_at else ""
        listing.add_row(rule.name, rule.owner, rule.describe(), rule.webhook_url or "-", created)
    return listing


def rule_record(rule: Rule) -> dict[str, object]:
    """A rule as ``ctr alerts list --json`` prints it: its fields, never its webhook secret."""
    fields = dataclasses.asdict(rule)
    del fields["secret"]
    return {"name": rule.name, "owner": rule.owner, "description": rule.describe(), **fields}


@app.command()
def delete(name: Name, owner: Owner = None) -> None:
    """Delete rule NAME (its past alerts stay in alerts/events)."""
    from alerts.rules import RuleError
    from alerts.store import delete_rule
    from lake.settings import LakeSettings

    try:
        deleted = delete_rule(LakeSettings(), name, owner=owner)
    except RuleError as exc:
        _fail(exc)
    console.print(f"deleted rule {name!r} of {deleted.owner}")


@app.command("test")
def try_rule(
    name: Name,
    owner: Owner = None,
    at: Annotated[
        str | None,
        typer.Option(
            help="The window's end, ISO-8601 (UTC unless it says). Default: the last minute."
        ),
    ] = None,
    wide: Wide = False,
    as_json: Json = False,
) -> None:
    """Evaluate rule NAME once, over the lake as it is, and print each group's test: the
    window's value against the baseline's, the change, the p-value (Holm-adjusted), whether
    it would fire and on what evidence (or why it was not tested). Records nothing, sends
    nothing."""
    from alerts.evaluate import evaluate_settled
    from alerts.lake_counts import LakeCounts
    from alerts.settings import AlertSettings
    from alerts.store import find_rule, read_rules
    from lake.settings import LakeSettings
    from serving_layer.reader import SnapshotReader

    one_output(as_json, wide)
    end = _end(at)
    lake = LakeSettings()
    rule, owners = find_rule(read_rules(lake), name, owner)
    if rule is None and owner is None and len(owners) > 1:
        fail(f"--owner: {len(owners)} owners have a rule named {name!r}: {', '.join(owners)}")
    if rule is None:
        fail(f"NAME: no rule is named {name!r} (ctr alerts list)")
    reader = SnapshotReader(lake, refresh_s=0)
    try:
        lag = dt.timedelta(seconds=AlertSettings().max_speed_lag_s)
        findings, behind = evaluate_settled([rule], LakeCounts(reader), end, lag)
    finally:
        reader.close()
    if as_json:
        print_json(findings_record(rule, findings, end, behind))
        return
    if behind is not None:
        console.print(f"untested on the speed layer's counts: {behind}")
    console.print(rule.describe())
    print_table(findings_listing(rule, findings, end), console, wide=wide)


@app.command()
def run() -> None:
    """Evaluate every rule each minute as the minute settles, until stopped (Ctrl-C,
    SIGTERM): alerts to alerts/events and to the rules' webhooks. One process per lake; it
    picks up where the last one stopped (ALERTS_* settings)."""
    import logging
    import signal
    import threading

    from alerts.lake_counts import LakeCounts
    from alerts.runner import Evaluator
    from alerts.settings import AlertSettings
    from lake.settings import LakeSettings
    from serving_layer.reader import SnapshotReader

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    lake, settings = LakeSettings(), AlertSettings()
    reader = SnapshotReader(lake, refresh_s=0)
    evaluator = Evaluator(lake, settings, lambda: LakeCounts(reader))
    metrics = None
    if settings.metrics_port is not None:
        from alerts.metrics import AlertMetrics
        from runtime.metrics import MetricsSettings, new_registry, serve

        registry = new_registry()
        metrics = AlertMetrics(registry)
        serve(registry, settings.metrics_port, MetricsSettings().host, "ALERTS_METRICS_PORT")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    console.print(f"alerts: evaluating the rules of {lake.lake_root} each minute", highlight=False)
    try:
        evaluator.run(stop, now=lambda: dt.datetime.now(dt.UTC), metrics=metrics)
    finally:
        evaluator.close()
        reader.close()
    console.print("alerts: stopped")


def _where(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    dimension, sign, wanted = value.partition("=")
    if not sign:
        raise typer.BadParameter(f"DIMENSION=VALUE, got {value!r}", param_hint="--where")
    return dimension.strip(), wanted


def _end(at: str | None) -> dt.datetime:
    from alerts.runner import due_end
    from batch_layer.interval import IntervalError, parse_time

    if at is None:
        return due_end(dt.datetime.now(dt.UTC), 60)
    try:
        return parse_time(at, "at").replace(second=0, microsecond=0)
    except IntervalError as exc:
        raise typer.BadParameter(str(exc), param_hint="--at") from None


def findings_listing(rule: Rule, findings: Sequence[Finding], end: dt.datetime) -> Listing:
    """``ctr alerts test``'s table: a row per group, its evidence or why it was not tested."""
    unit = "" if rule.rate else "; now and baseline in events per minute"
    listing = Listing(
        Column(rule.per or "rows", whole=True),
        Column("now", whole=True, justify="right"),
        Column("baseline", whole=True, justify="right"),
        Column("change", whole=True, justify="right"),
        Column("p (Holm)", whole=True, justify="right"),
        Column("fires", whole=True),
        "evidence",
        caption=f"window ending {minute(end)} UTC{unit}",
    )
    for finding in findings:
        result = finding.result
        listing.add_row(
            finding.group or "all",
            _number(result.current, rule.rate),
            _number(result.baseline, rule.rate),
            "" if result.change is None else f"{result.change:+.1%}",
            "" if finding.adjusted_p is None else f"{finding.adjusted_p:.2g}",
            "yes" if finding.significant else "no",
            finding.evidence if result.tested else f"not tested: {result.reason or '-'}",
        )
    return listing


def findings_record(
    rule: Rule, findings: Sequence[Finding], end: dt.datetime, behind: str | None
) -> dict[str, object]:
    """``ctr alerts test --json``: the rule, the window's end, and each group's test."""
    return {
        "rule": {"name": rule.name, "owner": rule.owner, "description": rule.describe()},
        "window_end": end,
        "untested_because": behind,
        "findings": [
            {
                "group": f.group,
                "window_start": f.window[0],
                "window_end": f.window[1],
                "current": f.result.current,
                "baseline": f.result.baseline,
                "change": f.result.change,
                "p_value": f.result.p_value,
                "adjusted_p": f.adjusted_p,
                "fires": f.significant,
                "evidence": f.evidence,
                "reason": f.result.reason or None,
                "trials": f.trials,
            }
            for f in findings
        ],
    }


def _number(value: float | None, rate: bool) -> str:
    """A rate as a percentage, a count as events per minute (said in the caption)."""
    if value is None:
        return ""
    return f"{value:.3%}" if rate else f"{value:,.1f}"


def _fail(exc: RuleError) -> NoReturn:
    fail(f"{_OPTIONS.get(exc.parameter, '--' + exc.parameter.replace('_', '-'))}: {exc.message}")
