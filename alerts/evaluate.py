"""One evaluation of the rules at a window's end: each rule's window and baseline windows summed
(per group when the rule fans out), its test made (:mod:`alerts.statistics`), corrected over
its groups (Holm), and judged against its minimum effect.

The counts come from a :class:`CountSource`: the lake's merged view through DuckDB
(:mod:`alerts.lake_counts`), or generated traffic in the truth benchmark. One call per distinct
window serves every rule that uses it, grouped by the dimensions the rules name, so the work
grows with the windows and the rows, not with the rules times the rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from alerts.rules import Rule
from alerts.statistics import TestResult, count_test, holm, rate_test, significant

Window = tuple[dt.datetime, dt.datetime]
Evidence = Literal["exact", "approximate", "too little data"]
NOT_TESTED: Final = "too little data"
MINUTES_PER_DAY: Final = 24 * 60


@dataclass(frozen=True)
class Counts:
    """A window's sums for one combination of dimension values; ``exact``: every row counted
    by the batch layer (none from the speed layer, no late event it has not counted)."""

    impressions: int = 0
    clicks: int = 0
    raw_clicks: int = 0
    orphan_clicks: int | None = 0
    exact: bool = True

    def __add__(self, other: Counts) -> Counts:
        orphans = (
            None
            if self.orphan_clicks is None or other.orphan_clicks is None
            else self.orphan_clicks + other.orphan_clicks
        )
        return Counts(
            self.impressions + other.impressions,
            self.clicks + other.clicks,
            self.raw_clicks + other.raw_clicks,
            orphans,
            self.exact and other.exact,
        )


class CountSource(Protocol):
    def counts(self, window: Window, dimensions: Sequence[str]) -> Mapping[tuple[str, ...], Counts]:
        """The window's sums per combination of ``dimensions``' values (all of its rows when
        ``dimensions`` is empty: one key, ``()``)."""
        ...

    def speed_behind(self, end: dt.datetime, max_lag: dt.timedelta) -> str | None:
        """Why the speed layer's counts of a window ending at ``end`` are not complete yet (it
        is catching up: at its last report it was more than ``max_lag`` behind and had not
        read past ``end``), or None."""
        ...


@dataclass(frozen=True)
class Finding:
    """A rule's test of one group (``group``: the ``per`` dimension's value, or None)."""

    rule: Rule
    group: str | None
    window: Window
    result: TestResult
    adjusted_p: float | None
    significant: bool
    evidence: Evidence
    trials: int


def dimensions_of(rules: Iterable[Rule]) -> tuple[str, ...]:
    """The dimensions the rules filter or fan out on (their scopes' included), in a fixed
    order."""
    used = {
        d
        for r in rules
        for d in ((r.where[0],) if r.where else ())
        + ((r.per,) if r.per else ())
        + r.scoped_dimensions
    }
    return tuple(sorted(used))


def evaluate(rules: Sequence[Rule], source: CountSource, end: dt.datetime) -> list[Finding]:
    """Every rule's findings for the window ending at ``end``."""
    dimensions = dimensions_of(rules)
    cache: dict[Window, Mapping[tuple[str, ...], Counts]] = {}

    def counts(window: Window) -> Mapping[tuple[str, ...], Counts]:
        if window not in cache:
            cache[window] = source.counts(window, dimensions)
        return cache[window]

    findings: list[Finding] = []
    for rule in rules:
        window, baselines = rule.windows(end)
        current = _grouped(rule, counts(window), dimensions)
        bases = [_grouped(rule, counts(b), dimensions) for b in baselines]
        groups = sorted(set(current) | {g for b in bases for g in b}, key=lambda g: g or "")
        results = [
            _test(rule, current.get(g, Counts()), [b.get(g, Counts()) for b in bases])
            for g in groups
        ]
        adjusted = per_day(holm([r.p_value for r in results]), rule.window_minutes)
        for group, result, p in zip(groups, results, adjusted, strict=True):
            now = current.get(group, Counts())
            tested = result.tested
            evidence: Evidence = (
                NOT_TESTED if not tested else "exact" if now.exact else "approximate"
            )
            findings.append(
                Finding(
                    rule=rule,
                    group=group,
                    window=window,
                    result=result,
                    adjusted_p=p,
                    significant=significant(
                        result,
                        p,
                        alpha=rule.alpha,
                        min_effect=rule.min_effect,
                        direction=rule.direction,
                    ),
                    evidence=evidence,
                    trials=now.raw_clicks if rule.measure == "orphan_share" else now.impressions,
                )
            )
    return findings


def evaluate_settled(
    rules: Sequence[Rule], source: CountSource, end: dt.datetime, max_speed_lag: dt.timedelta
) -> tuple[list[Finding], str | None]:
    """:func:`evaluate`, with the tests on the speed layer's counts held untested while it
    catches up (:meth:`CountSource.speed_behind`); and why they were held, or None."""
    findings = evaluate(rules, source, end)
    behind = source.speed_behind(end, max_speed_lag)
    return (findings, None) if behind is None else (held(findings, behind), behind)


def held(findings: Iterable[Finding], reason: str) -> list[Finding]:
    """``findings`` with every test on the speed layer's counts left untested for ``reason``
    (neither fires nor resolves: the window's counts are still coming in)."""
    return [
        dataclasses.replace(
            f,
            result=dataclasses.replace(f.result, p_value=None, reason=reason),
            adjusted_p=None,
            significant=False,
            evidence=NOT_TESTED,
        )
        if f.evidence == "approximate"
        else f
        for f in findings
    ]


def per_day(p_values: Sequence[float | None], window_minutes: int) -> list[float | None]:
    """P-values that hold the rule's level per group and day: a rule is tested every minute,
    and a day holds 1,440 / ``window_minutes`` windows that share no minute, so each p-value is
    multiplied by that (Bonferroni over the day's independent windows; capped at 1)."""
    windows = MINUTES_PER_DAY / window_minutes
    return [None if p is None else min(1.0, p * windows) for p in p_values]


def _grouped(
    rule: Rule, rows: Mapping[tuple[str, ...], Counts], dimensions: Sequence[str]
) -> dict[str | None, Counts]:
    """The rows ``rule`` watches (of its scope only), summed per value of its ``per`` dimension
    (None: one sum)."""
    where = (dimensions.index(rule.where[0]), rule.where[1]) if rule.where else None
    per = dimensions.index(rule.per) if rule.per else None
    sums: dict[str | None, Counts] = defaultdict(Counts)
    for key, counts in rows.items():
        if where is not None and key[where[0]] != where[1]:
            continue
        if rule.scope is not None and not rule.admits(dict(zip(dimensions, key, strict=True))):
            continue
        group = key[per] if per is not None else None
        sums[group] = sums[group] + counts
    return dict(sums)


def _test(rule: Rule, now: Counts, bases: Sequence[Counts]) -> TestResult:
    base = sum(bases, Counts())
    if rule.measure == "ctr":
        return rate_test(
            now.clicks, now.impressions, base.clicks, base.impressions, min_trials=rule.min_trials
        )
    if rule.measure == "orphan_share":
        if now.orphan_clicks is None or base.orphan_clicks is None:
            return TestResult(None, None, None, None, "the view does not attribute clicks")
        return rate_test(
            now.orphan_clicks,
            now.raw_clicks,
            base.orphan_clicks,
            base.raw_clicks,
            min_trials=rule.min_trials,
        )
    field = rule.measure  # impressions or clicks (attributed clicks in a view that attributes)
    minutes = rule.window_minutes
    base_minutes = minutes if rule.baseline == "days" else rule.baseline_minutes
    return count_test(
        getattr(now, field), minutes, [getattr(b, field) for b in bases], base_minutes
    )
