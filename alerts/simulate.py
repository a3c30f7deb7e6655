"""Generated traffic at minute grain with changes injected at known times: the truth the alert
rules are judged against (:mod:`alerts.truth`). Pure and seeded (one numpy Generator), and a
:class:`~alerts.evaluate.CountSource`, so :func:`alerts.evaluate.evaluate` reads it as it reads
the lake.

The model, per ad and minute, from ``baseline_days`` days (and :data:`PAD` minutes) before the
simulated day's start to its end:

- **campaigns**: ``campaigns`` big ones of ``ads_per_campaign`` ads each, and
  ``noise_campaigns`` small ones (a few impressions a minute per ad) that never change;
- **impressions** ~ Poisson(an ad's rate x a daily cycle (quietest at 00:00, busiest at noon)
  x the campaign's factor for the day (log-normal: day-to-day variation));
- **clicks** ~ Binomial(impressions, the ad's CTR x the ad's factor for the day (log-normal,
  small) x the injected change's factor from its minute on).

Two changes are injected (:class:`Change`): a CTR drop of 30 % on the first (the busiest) ad of
the first campaign, and a click-tracking break (clicks 0) on every ad of the second campaign.
:meth:`SimulatedTraffic.expected` names, for a set of rules, which (rule, group) has a change,
from which minute, and how large it is expected to be.

Memory: two int32 arrays of minutes x ads for the counts and two int64 cumulative sums (a
window's sum is two rows' difference); for 24 h + 7 days and 40 ads, about 11 MB.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from alerts.evaluate import Counts, Window
from alerts.rules import Rule

MINUTE: Final = dt.timedelta(minutes=1)
DAY_MINUTES: Final = 24 * 60
# Minutes generated before the first baseline day's window: the longest rule window served.
PAD: Final = 60
DAY: Final = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)
ChangeKind = Literal["ctr drop", "tracking break"]


@dataclass(frozen=True)
class Change:
    """Clicks of ``ads`` (of ``campaign``) multiplied by ``factor`` from ``minute`` (minutes
    after the simulated day's start) on: 0.7 is a 30 % CTR drop, 0 a tracking break."""

    kind: ChangeKind
    campaign: str
    ads: tuple[str, ...]
    minute: int
    factor: float


@dataclass(frozen=True)
class TrafficSpec:
    """The generated traffic's shape (rates are impressions per minute per ad, on average over
    the day) and when the changes happen (minutes after ``start``)."""

    seed: int = 53
    start: dt.datetime = DAY
    hours: int = 24
    baseline_days: int = 7
    campaigns: int = 4
    ads_per_campaign: int = 5
    rate: tuple[float, float] = (150.0, 600.0)
    noise_campaigns: int = 5
    noise_ads: int = 3
    noise_rate: tuple[float, float] = (1.0, 8.0)
    ctr: tuple[float, float] = (0.01, 0.04)
    daily_amplitude: float = 0.5
    day_to_day: float = 0.1  # the sd of a campaign's log traffic from one day to the next
    ctr_day_to_day: float = 0.03  # the sd of an ad's log CTR from one day to the next
    drop_minute: int = 180
    drop_factor: float = 0.7
    break_minute: int = 600


@dataclass(frozen=True)
class Expected:
    """A (rule, group) whose measure an injected change moves: from ``minute`` on, by
    ``effect`` (relative, expected: -0.3 is a 30 % drop) once the window is all after it."""

    rule: Rule
    group: str | None
    change: Change
    effect: float

    @property
    def reachable(self) -> int:
        """The first window end (minutes after the start) whose expected change reaches the
        rule's minimum effect: a rule cannot tell the change before (traffic even over the
        window)."""
        if self.effect == 0:
            return self.change.minute + self.rule.window_minutes
        share = min(1.0, self.rule.min_effect / abs(self.effect))
        return self.change.minute + max(1, math.ceil(self.rule.window_minutes * share - 1e-9))


class SimulatedTraffic:
    """The generated traffic of ``spec``: a CountSource over campaign_id and ad_id."""

    def __init__(self, spec: TrafficSpec | None = None) -> None:
        self.spec = spec = spec or TrafficSpec()
        rng = np.random.default_rng(spec.seed)
        self.campaign_of: dict[str, str] = {}
        big = [f"cmp-{c + 1:02d}" for c in range(spec.campaigns)]
        noise = [f"noise-{c + 1:02d}" for c in range(spec.noise_campaigns)]
        for campaign in big:
            for a in range(spec.ads_per_campaign):
                self.campaign_of[f"{campaign}-ad-{a + 1}"] = campaign
        for campaign in noise:
            for a in range(spec.noise_ads):
                self.campaign_of[f"{campaign}-ad-{a + 1}"] = campaign
        self.campaigns, self.noise = big, noise
        self.ads = list(self.campaign_of)
        self.origin = spec.start - dt.timedelta(days=spec.baseline_days, minutes=PAD)
        self.minutes = spec.baseline_days * DAY_MINUTES + PAD + spec.hours * 60
        self.changes = self._changes()
        self.rates, self.ctrs = self._ads(rng)
        self.impressions, self.clicks = self._generate(rng)
        zero = np.zeros((1, len(self.ads)), np.int64)
        self._cum_impressions = np.vstack([zero, np.cumsum(self.impressions, 0, np.int64)])
        self._cum_clicks = np.vstack([zero, np.cumsum(self.clicks, 0, np.int64)])
        self._column = {ad: i for i, ad in enumerate(self.ads)}

    def _changes(self) -> list[Change]:
        spec = self.spec
        changes = []
        if spec.campaigns >= 1:
            first = self.campaigns[0]
            changes.append(
                Change("ctr drop", first, (f"{first}-ad-1",), spec.drop_minute, spec.drop_factor)
            )
        if spec.campaigns >= 2:
            second = self.campaigns[1]
            ads = tuple(ad for ad, c in self.campaign_of.items() if c == second)
            changes.append(Change("tracking break", second, ads, spec.break_minute, 0.0))
        return changes

    def _ads(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Each ad's mean impressions per minute and base CTR (the first ad of each big
        campaign the busiest)."""
        spec = self.spec
        rates = np.empty(len(self.ads))
        for i, ad in enumerate(self.ads):
            noise = self.campaign_of[ad] in self.noise
            low, high = spec.noise_rate if noise else spec.rate
            rates[i] = high if not noise and ad.endswith("-ad-1") else rng.uniform(low, high)
        ctrs = rng.uniform(*spec.ctr, len(self.ads))
        return rates, ctrs

    def _generate(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        steps = np.arange(self.minutes)
        since_start = steps - (spec.baseline_days * DAY_MINUTES + PAD)
        of_day = (since_start + spec.start.hour * 60 + spec.start.minute) % DAY_MINUTES
        cycle = 1.0 - spec.daily_amplitude * np.cos(2 * np.pi * of_day / DAY_MINUTES)
        day = since_start // DAY_MINUTES + spec.baseline_days  # 0 .. baseline_days
        days = spec.baseline_days + 1
        campaign_index = {c: i for i, c in enumerate(self.campaigns + self.noise)}
        owner = np.array([campaign_index[self.campaign_of[ad]] for ad in self.ads])
        traffic = rng.lognormal(0.0, spec.day_to_day, (days, len(campaign_index)))
        ctr_noise = rng.lognormal(0.0, spec.ctr_day_to_day, (days, len(self.ads)))
        mean = self.rates[None, :] * cycle[:, None] * traffic[day][:, owner]
        impressions = rng.poisson(mean).astype(np.int32)
        ctr = np.clip(self.ctrs[None, :] * ctr_noise[day], 0.0, 1.0)
        for change in self.changes:
            columns = np.array([self.ads.index(ad) for ad in change.ads])
            rows = since_start >= change.minute
            ctr[np.ix_(rows, columns)] *= change.factor
        clicks = rng.binomial(impressions, ctr).astype(np.int32)
        return impressions, clicks

    # -- the CountSource ---------------------------------------------------------------------

    def index(self, at: dt.datetime) -> int:
        """The row of the minute starting at ``at`` (its cumulative sums' row: the minutes
        before it)."""
        step = (at - self.origin) // MINUTE
        if not 0 <= step <= self.minutes:
            raise ValueError(f"{at} is outside the generated traffic ({self.origin} + "
                             f"{self.minutes} min)")  # fmt: skip
        return int(step)

    def window_sums(self, window: Window) -> tuple[np.ndarray, np.ndarray]:
        """Impressions and clicks per ad (in :attr:`ads`' order) over ``window``."""
        first, last = self.index(window[0]), self.index(window[1])
        return (
            self._cum_impressions[last] - self._cum_impressions[first],
            self._cum_clicks[last] - self._cum_clicks[first],
        )

    def speed_behind(self, end: dt.datetime, max_lag: dt.timedelta) -> str | None:
        return None  # generated traffic: every minute complete

    def counts(self, window: Window, dimensions: Sequence[str]) -> Mapping[tuple[str, ...], Counts]:
        unknown = set(dimensions) - {"campaign_id", "ad_id"}
        if unknown:
            raise ValueError(f"the simulated traffic has campaign_id and ad_id only: {unknown}")
        impressions, clicks = self.window_sums(window)
        sums: dict[tuple[str, ...], tuple[int, int]] = {}
        for ad, shown, clicked in zip(self.ads, impressions.tolist(), clicks.tolist(), strict=True):
            if not shown:
                continue
            values = {"campaign_id": self.campaign_of[ad], "ad_id": ad}
            key = tuple(values[d] for d in dimensions)
            before = sums.get(key, (0, 0))
            sums[key] = (before[0] + shown, before[1] + clicked)
        return {key: Counts(i, c, c, 0, True) for key, (i, c) in sums.items()}

    # -- the truth ---------------------------------------------------------------------------

    def ads_of(self, rule: Rule, group: str | None) -> list[str]:
        """The ads the rule's ``group`` sums."""
        ads = self.ads
        if rule.where is not None:
            dimension, value = rule.where
            ads = [a for a in ads if (a if dimension == "ad_id" else self.campaign_of[a]) == value]
        if rule.per is not None and group is not None:
            ads = [a for a in ads if (a if rule.per == "ad_id" else self.campaign_of[a]) == group]
        return ads

    def campaign_of_group(self, rule: Rule, group: str | None) -> str | None:
        """The campaign a rule's group belongs to (None: several)."""
        owners = {self.campaign_of[a] for a in self.ads_of(rule, group)}
        return owners.pop() if len(owners) == 1 else None

    def expected(self, rules: Sequence[Rule]) -> list[Expected]:
        """Every (rule, group) an injected change moves, with the expected relative change of
        the rule's measure (CTR and clicks: the group's expected clicks, before and after)."""
        found = []
        for rule in rules:
            if rule.measure not in ("ctr", "clicks"):
                continue
            groups: list[str | None] = [None]
            if rule.per == "ad_id":
                groups = list(self.ads)
            elif rule.per == "campaign_id":
                groups = list(dict.fromkeys(self.campaign_of.values()))
            for group in groups:
                ads = self.ads_of(rule, group)
                for change in self.changes:
                    if not set(change.ads) & set(ads):
                        continue
                    found.append(Expected(rule, group, change, self._effect(ads, change)))
        return found

    def _effect(self, ads: Sequence[str], change: Change) -> float:
        columns = [self._column[a] for a in ads]
        weights = self.rates[columns] * self.ctrs[columns]
        factors = np.array([change.factor if a in change.ads else 1.0 for a in ads])
        return float((weights * factors).sum() / weights.sum() - 1.0)

    def baseline_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Impressions and clicks per ad over every generated minute before the simulated day
        (the threshold rule's long-run CTR)."""
        last = self.index(self.spec.start)
        return self._cum_impressions[last].copy(), self._cum_clicks[last].copy()

    def columns(self, ads: Sequence[str]) -> list[int]:
        """The ads' positions in the per-ad arrays."""
        return [self._column[a] for a in ads]
