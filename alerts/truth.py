"""The alert rules judged against the truth: the rules evaluated minute by minute over
generated traffic with injected changes (:mod:`alerts.simulate`), each (rule, group) held
steady by its own :class:`~alerts.hysteresis.Hysteresis` as the evaluator holds it, and what
they fired compared with what was injected.

Per rule: its **detections** (a "fired" on a group an injected change moves, at or after the
change's first minute), each one's **delay** (minutes from the change's first minute to the end
of the window that fired), its **misses**, and its **false alarms** (a "fired" on a group, or at
a time, with no change), those on the noise-only campaigns apart.

A change is *required* of a rule (its absence a miss) when its expected effect on the group is
at least the rule's minimum effect and the group had at least :data:`MIN_IMPRESSIONS`
impressions in the window. A rule cannot tell a change before its window's expected change
reaches the minimum effect (:attr:`~alerts.simulate.Expected.reachable`: a 30 % drop, 20 %
minimum effect and a 15-minute window: 10 minutes in); a miss is a required change that never
fired, or fired more than :data:`GRACE_MINUTES` after that point.

The **threshold baseline**, for comparison and not a product rule: a CTR rule's twin that
fires when the window's CTR is outside ± ``band`` of the group's long-run CTR (over the
baseline days), with no test and no minimum sample, through the same hysteresis.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from alerts.evaluate import evaluate
from alerts.hysteresis import Hysteresis
from alerts.rules import Rule
from alerts.simulate import MINUTE, Expected, SimulatedTraffic

MIN_IMPRESSIONS: Final = 2_000
GRACE_MINUTES: Final = 5
THRESHOLD_PREFIX: Final = "threshold-"
Key = tuple[str, str | None]


def rules_for(traffic: SimulatedTraffic, *, window_minutes: int = 15) -> list[Rule]:
    """Per campaign (big and noise): its ads' CTR (one test per ad), its CTR, its clicks."""
    rules = []
    common = {"alpha": 0.01, "min_effect": 0.2, "window_minutes": window_minutes}
    for campaign in traffic.campaigns + traffic.noise:
        where = ("campaign_id", campaign)
        rules += [
            Rule.create(name=f"{campaign}-ads", measure="ctr", where=where, per="ad_id", **common),
            Rule.create(name=f"{campaign}-ctr", measure="ctr", where=where, **common),
            Rule.create(name=f"{campaign}-clicks", measure="clicks", where=where, **common),
        ]
    return rules


def family(rule: Rule) -> str:
    """What a rule watches, for the table: ``ad CTR``, ``campaign clicks``, ``threshold …``."""
    kind = "threshold " if rule.name.startswith(THRESHOLD_PREFIX) else ""
    per = rule.per.removesuffix("_id") if rule.per else (rule.where or ("all",))[0]
    return f"{kind}{per.removesuffix('_id')} {rule.measure.replace('ctr', 'CTR')}"


@dataclass(frozen=True)
class Threshold:
    """A CTR rule's threshold twin: per group, its ads' columns and its long-run CTR."""

    rule: Rule
    groups: list[tuple[str | None, list[int], float]]

    @classmethod
    def of(cls, rule: Rule, traffic: SimulatedTraffic, band: float) -> Threshold:
        twin = dataclasses.replace(rule, name=f"{THRESHOLD_PREFIX}{rule.name}", min_effect=band)
        impressions, clicks = traffic.baseline_sums()
        groups: list[str | None] = (
            list(traffic.ads_of(rule, None)) if rule.per == "ad_id" else [None]
        )
        found = []
        for group in groups:
            columns = traffic.columns(traffic.ads_of(rule, group))
            shown = int(impressions[columns].sum())
            found.append((group, columns, float(clicks[columns].sum()) / max(1, shown)))
        return cls(twin, found)

    def judge(
        self, impressions: np.ndarray, clicks: np.ndarray, band: float
    ) -> Iterable[tuple[str | None, bool, bool]]:
        """Per group: tested (any impression), outside the band."""
        for group, columns, anchor in self.groups:
            shown = int(impressions[columns].sum())
            if not shown:
                yield group, False, False
                continue
            ctr = float(clicks[columns].sum()) / shown
            yield group, True, abs(ctr - anchor) > band * anchor


@dataclass(frozen=True)
class Outcome:
    """One injected change as one rule saw it on one group."""

    expected: Expected
    fired: int | None  # the first window end (minutes after the start) that fired, if any
    required: bool

    @property
    def delay(self) -> int | None:
        return None if self.fired is None else self.fired - self.expected.change.minute

    @property
    def missed(self) -> bool:
        late = self.fired is None or self.fired > self.expected.reachable + GRACE_MINUTES
        return self.required and late


@dataclass
class Tally:
    """A family of rules' figures over the run."""

    family: str
    evaluations: int = 0
    tested: int = 0
    detections: int = 0
    delays: list[int] = field(default_factory=list)
    misses: int = 0
    false_alarms_noise: int = 0
    false_alarms_other: int = 0


@dataclass
class Truth:
    """What a run found: the outcome of every injected change per (rule, group), the false
    alarms (rule, group, minute), and the tallies per family of rules."""

    outcomes: list[Outcome]
    false_alarms: list[tuple[Rule, str | None, int]]
    tallies: dict[str, Tally]


@dataclass
class _Run:
    """The state of a run: the hysteresis and the "fired" minutes per (rule, group)."""

    fire_after: int
    resolve_after: int
    states: dict[Key, Hysteresis] = field(default_factory=dict)
    fired: dict[Key, list[int]] = field(default_factory=lambda: defaultdict(list))
    evaluations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tested: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def update(self, rule: Rule, group: str | None, minute: int, tested: bool, hit: bool) -> None:
        key = (rule.name, group)
        if key not in self.states:
            self.states[key] = Hysteresis(self.fire_after, self.resolve_after)
        self.evaluations[rule.name] += 1
        self.tested[rule.name] += tested
        if self.states[key].update(tested, hit) == "fired":
            self.fired[key].append(minute)


def run(
    traffic: SimulatedTraffic,
    rules: Sequence[Rule],
    *,
    band: float = 0.2,
    fire_after: int = 2,
    resolve_after: int = 5,
) -> Truth:
    """Evaluate ``rules`` (and the threshold twins of their CTR rules, ± ``band``) for the
    window ending at each minute of the simulated day, and score what fired."""
    thresholds = [Threshold.of(r, traffic, band) for r in rules if r.measure == "ctr"]
    state = _Run(fire_after, resolve_after)
    start = traffic.spec.start
    for minute in range(1, traffic.spec.hours * 60 + 1):
        end = start + minute * MINUTE
        for finding in evaluate(rules, traffic, end):
            tested = finding.result.tested
            state.update(finding.rule, finding.group, minute, tested, finding.significant)
        for threshold in thresholds:
            size = dt.timedelta(minutes=threshold.rule.window_minutes)
            impressions, clicks = traffic.window_sums((end - size, end))
            for group, tested, outside in threshold.judge(impressions, clicks, band):
                state.update(threshold.rule, group, minute, tested, outside)
    return score(traffic, [*rules, *(t.rule for t in thresholds)], state)


def score(traffic: SimulatedTraffic, rules: Sequence[Rule], state: _Run) -> Truth:
    """The outcomes, false alarms and tallies of a run's "fired" minutes."""
    expected = traffic.expected(rules)
    outcomes = [_outcome(traffic, e, state.fired.get((e.rule.name, e.group), [])) for e in expected]
    changed: dict[Key, int] = {}
    for e in expected:
        key = (e.rule.name, e.group)
        changed[key] = min(changed.get(key, e.change.minute), e.change.minute)
    by_name = {r.name: r for r in rules}
    false_alarms = [
        (by_name[name], group, minute)
        for (name, group), minutes in state.fired.items()
        for minute in minutes
        if (name, group) not in changed or minute <= changed[(name, group)]
    ]
    tallies: dict[str, Tally] = {}
    for rule in rules:
        tally = tallies.setdefault(family(rule), Tally(family(rule)))
        tally.evaluations += state.evaluations[rule.name]
        tally.tested += state.tested[rule.name]
    for outcome in outcomes:
        tally = tallies[family(outcome.expected.rule)]
        if outcome.delay is not None:
            tally.detections += 1
            tally.delays.append(outcome.delay)
        tally.misses += outcome.missed
    for rule, group, _ in false_alarms:
        tally = tallies[family(rule)]
        if traffic.campaign_of_group(rule, group) in traffic.noise:
            tally.false_alarms_noise += 1
        else:
            tally.false_alarms_other += 1
    return Truth(outcomes, false_alarms, tallies)


def _outcome(traffic: SimulatedTraffic, expected: Expected, fired: Sequence[int]) -> Outcome:
    after = [m for m in fired if m > expected.change.minute]
    deadline = expected.reachable + GRACE_MINUTES
    required = False
    if abs(expected.effect) >= expected.rule.min_effect and deadline <= traffic.spec.hours * 60:
        end = traffic.spec.start + deadline * MINUTE
        window = (end - dt.timedelta(minutes=expected.rule.window_minutes), end)
        impressions, _ = traffic.window_sums(window)
        columns = traffic.columns(traffic.ads_of(expected.rule, expected.group))
        required = int(impressions[columns].sum()) >= MIN_IMPRESSIONS
    return Outcome(expected, after[0] if after else None, required)
