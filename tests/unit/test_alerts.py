"""Alert rules and their statistics (pure logic): the tests' p-values, the small-sample guard,
Holm's correction, the calibration of false alarms under no change, and the evaluation of rules
over counts given per window."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from access.roles import Scope
from alerts.evaluate import Counts, Window, dimensions_of, evaluate, evaluate_settled, held
from alerts.rules import Rule, RuleError
from alerts.statistics import (
    count_test,
    dispersion,
    holm,
    normal_sf,
    rate_test,
    significant,
    student_sf,
)

END = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)


def test_the_normal_tail_is_the_tables() -> None:
    assert normal_sf(0) == pytest.approx(0.5)
    assert normal_sf(1.959964) == pytest.approx(0.025, abs=1e-6)
    assert normal_sf(-1.644854) == pytest.approx(0.95, abs=1e-6)


def test_a_rate_that_did_not_move_is_not_significant_and_a_30_percent_drop_is() -> None:
    same = rate_test(200, 10_000, 1_400, 70_000)
    assert same.change == pytest.approx(0.0)
    assert same.p_value == pytest.approx(1.0)
    drop = rate_test(140, 10_000, 1_400, 70_000)
    assert drop.change == pytest.approx(-0.3)
    assert drop.p_value is not None
    assert drop.p_value < 1e-4


def test_a_rate_on_too_few_trials_is_not_tested_and_says_why() -> None:
    few = rate_test(0, 40, 100, 5_000, min_trials=1000)
    assert not few.tested
    assert few.reason == "40 trials < 1000"
    rare = rate_test(1, 2_000, 3, 10_000)  # expected clicks under 10: the approximation fails
    assert not rare.tested
    assert "expected counts" in rare.reason


def test_a_count_test_discounts_the_baselines_own_day_to_day_variation() -> None:
    steady = [1000, 1010, 990, 1005, 995, 1000, 1002]
    swinging = [700, 1300, 800, 1250, 900, 1150, 900]
    assert dispersion(steady) == 1.0
    assert dispersion(swinging) > 50
    calm = count_test(1200, 15, steady, 15)
    noisy = count_test(1200, 15, swinging, 15)
    assert calm.p_value is not None
    assert noisy.p_value is not None
    assert calm.p_value < 0.01
    assert noisy.p_value > 0.05


def test_students_t_is_the_tables() -> None:
    """The counts' test is judged on t with 6 degrees of freedom (7 baseline days)."""
    assert student_sf(0.0, 6) == pytest.approx(0.5)
    assert student_sf(2.447, 6) == pytest.approx(0.025, abs=1e-4)
    assert student_sf(3.707, 6) == pytest.approx(0.005, abs=1e-4)
    assert student_sf(1.96, 100_000) == pytest.approx(normal_sf(1.96), abs=1e-5)


def test_holm_adjusts_step_down_and_keeps_untested_groups_untested() -> None:
    adjusted = holm([0.01, 0.04, None, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, None, 0.06, 0.02])


def test_significance_needs_the_level_the_effect_and_the_direction() -> None:
    drop = rate_test(140, 10_000, 1_400, 70_000)
    assert significant(drop, drop.p_value, alpha=0.01, min_effect=0.2)
    assert significant(drop, drop.p_value, alpha=0.01, min_effect=0.2, direction="drop")
    assert not significant(drop, drop.p_value, alpha=0.01, min_effect=0.2, direction="rise")
    assert not significant(drop, drop.p_value, alpha=0.01, min_effect=0.35)
    assert not significant(drop, 0.02, alpha=0.01, min_effect=0.2)
    assert not significant(drop, None, alpha=0.01, min_effect=0.0)


def test_under_no_change_the_false_alarm_rate_is_the_level() -> None:
    """2,000 windows of a steady 2 % CTR (fixed seed): rejections at alpha = 0.05 near 5 %."""
    rng = np.random.default_rng(7)
    ctr, trials, base_trials = 0.02, 5_000, 35_000
    clicks = rng.binomial(trials, ctr, 2_000)
    base = rng.binomial(base_trials, ctr, 2_000)
    p = [
        rate_test(int(c), trials, int(b), base_trials).p_value
        for c, b in zip(clicks, base, strict=True)
    ]
    rate = sum(1 for v in p if v is not None and v < 0.05) / len(p)
    assert 0.035 <= rate <= 0.065


class Counted:
    """Counts given per window and combination of (campaign_id, ad_id)."""

    def __init__(self, by_window: Mapping[Window, Mapping[tuple[str, str], Counts]]) -> None:
        self.by_window = by_window
        self.asked: list[tuple[Window, tuple[str, ...]]] = []
        self.behind: str | None = None  # what speed_behind says

    def counts(self, window: Window, dimensions: Sequence[str]) -> Mapping[tuple[str, ...], Counts]:
        self.asked.append((window, tuple(dimensions)))
        summed: dict[tuple[str, ...], Counts] = {}
        for (campaign, ad), counts in self.by_window.get(window, {}).items():
            values = {"campaign_id": campaign, "ad_id": ad}
            key = tuple(values[d] for d in dimensions)
            summed[key] = summed.get(key, Counts()) + counts
        return summed

    def speed_behind(self, end: dt.datetime, max_lag: dt.timedelta) -> str | None:
        return self.behind


def _traffic(rule: Rule, drop_ad: str, exact: bool = False) -> Counted:
    """The rule's baseline windows at a steady 2 % CTR on every ad; its window the same, but
    ``drop_ad`` at 1.2 %, and the window's counts the speed layer's unless ``exact``."""
    window, baselines = rule.windows(END)
    normal = {
        ("cmp-1", "ad-1"): Counts(10_000, 200, 200, 0, True),
        ("cmp-1", "ad-2"): Counts(10_000, 200, 200, 0, True),
        ("cmp-1", "ad-small"): Counts(50, 1, 1, 0, True),
        ("cmp-2", "ad-9"): Counts(10_000, 200, 200, 0, True),
    }
    now = {
        key: Counts(c.impressions, c.clicks, c.raw_clicks, 0, exact) for key, c in normal.items()
    }
    now[("cmp-1", drop_ad)] = Counts(10_000, 120, 120, 0, exact)
    return Counted({window: now, **{b: normal for b in baselines}})


def test_a_rule_per_ad_finds_the_ad_whose_ctr_dropped_and_no_other() -> None:
    rule = Rule.create(name="cmp-1-ads", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id")
    source = _traffic(rule, "ad-2")
    findings = {f.group: f for f in evaluate([rule], source, END)}
    assert set(findings) == {"ad-1", "ad-2", "ad-small"}  # cmp-2's ad is not watched
    assert findings["ad-2"].significant
    assert findings["ad-2"].evidence == "approximate"  # the window's counts are the speed layer's
    assert findings["ad-2"].result.change == pytest.approx(-0.4)
    assert not findings["ad-1"].significant
    assert findings["ad-small"].evidence == "too little data"
    assert findings["ad-small"].adjusted_p is None
    # Holm over the two tested ads (the smallest p doubled), then the day's 96 windows of 15
    # minutes: alpha holds per group and day.
    p_value = findings["ad-2"].result.p_value
    assert p_value is not None
    assert findings["ad-2"].adjusted_p == pytest.approx(2 * p_value * 96)
    # One count per window, for every rule: the window and its 7 days.
    assert len(source.asked) == 8


def test_a_window_the_batch_layer_counted_is_exact_evidence() -> None:
    rule = Rule.create(name="cmp-1", measure="ctr", where=("campaign_id", "cmp-1"))
    assert dimensions_of([rule]) == ("campaign_id",)
    (finding,) = evaluate([rule], _traffic(rule, "ad-1", exact=True), END)
    assert finding.group is None
    assert finding.evidence == "exact"
    # 321 clicks of 20,050 against 2 %: beyond chance in this window, but a drop of 19.95 %,
    # under the rule's minimum effect of 20 %; and not beyond chance for a whole day of
    # windows (alpha holds per day): not news.
    assert finding.result.change == pytest.approx(321 / 20_050 / 0.02 - 1)
    assert finding.result.p_value is not None
    assert finding.result.p_value < 0.001
    assert finding.adjusted_p == pytest.approx(finding.result.p_value * 96)
    assert not finding.significant
    (speed,) = evaluate([rule], _traffic(rule, "ad-1"), END)
    assert speed.evidence == "approximate"


def test_while_the_speed_layer_catches_up_its_counts_are_held_untested() -> None:
    rule = Rule.create(name="cmp-1-ads", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id")
    source = _traffic(rule, "ad-2")
    source.behind = "catching up"
    findings, why = evaluate_settled([rule], source, END, dt.timedelta(minutes=2))
    assert why == "catching up"
    assert findings == held(evaluate([rule], source, END), "catching up")
    dropped = {f.group: f for f in findings}["ad-2"]
    assert (dropped.significant, dropped.evidence) == (False, "too little data")
    assert (dropped.adjusted_p, dropped.result.reason) == (None, "catching up")
    assert dropped.result.change == pytest.approx(-0.4)  # still shown, not tested
    # The batch layer's counts are complete: tested as they were.
    whole = Rule.create(name="cmp-1", measure="ctr", where=("campaign_id", "cmp-1"))
    (exact,) = evaluate([whole], _traffic(whole, "ad-1", exact=True), END)
    assert exact.evidence == "exact"
    assert held([exact], "catching up") == [exact]
    # Caught up: evaluated as is.
    source.behind = None
    assert evaluate_settled([rule], source, END, dt.timedelta(minutes=2)) == (
        evaluate([rule], source, END),
        None,
    )


def test_the_orphan_share_needs_a_view_that_attributes_clicks() -> None:
    rule = Rule.create(name="orphans", measure="orphan_share", min_trials=0)
    without = {(): Counts(10_000, 200, 200, None, False)}
    source = type("S", (), {"counts": lambda self, w, d: without})()
    (finding,) = evaluate([rule], source, END)
    assert not finding.result.tested
    assert finding.result.reason == "the view does not attribute clicks"


def test_rule_windows_and_their_baselines() -> None:
    days = Rule.create(name="d", measure="ctr", window_minutes=15, baseline_days=2)
    window, baselines = days.windows(END)
    assert window == (END - dt.timedelta(minutes=15), END)
    assert baselines == [
        (END - dt.timedelta(days=1, minutes=15), END - dt.timedelta(days=1)),
        (END - dt.timedelta(days=2, minutes=15), END - dt.timedelta(days=2)),
    ]
    previous = Rule.create(name="p", measure="clicks", baseline="previous", baseline_minutes=60)
    assert previous.windows(END)[1] == [
        (END - dt.timedelta(minutes=75), END - dt.timedelta(minutes=15))
    ]


@pytest.mark.parametrize(
    ("fields", "parameter"),
    [
        ({"name": "no spaces"}, "name"),
        ({"measure": "revenue"}, "measure"),
        ({"where": ("region", "eu")}, "where"),
        ({"where": ("campaign_id", "c"), "per": "campaign_id"}, "per"),
        ({"window_minutes": 0}, "window_minutes"),
        ({"baseline": "weeks"}, "baseline"),
        ({"alpha": 0.5}, "alpha"),
        ({"direction": "sideways"}, "direction"),
        ({"webhook_url": "ftp://x"}, "webhook_url"),
        ({"scope": Scope.create(["mine"]), "where": ("campaign_id", "theirs")}, "where"),
        ({"scope": Scope.create(["mine"])}, "where"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field(fields: dict[str, object], parameter: str) -> None:
    with pytest.raises(RuleError) as refused:
        Rule.create(**{"name": "r", "measure": "ctr", **fields})
    assert refused.value.parameter == parameter


def test_an_advertisers_rule_on_its_own_campaign_is_accepted() -> None:
    rule = Rule.create(
        name="mine", measure="ctr", where=("campaign_id", "mine"), scope=Scope.create(["mine"])
    )
    assert "ctr of campaign_id=mine" in rule.describe()


def test_a_campaign_scoped_advertiser_may_watch_an_ad_and_an_ad_scoped_one_only_its_own() -> None:
    campaigns = Scope.create(["cmp-1"])
    assert Rule.create(name="ad", measure="ctr", where=("ad_id", "ad-2"), scope=campaigns)
    ads = Scope.create(["cmp-1"], ["ad-1"])
    assert Rule.create(name="ad", measure="ctr", where=("ad_id", "ad-1"), scope=ads)
    with pytest.raises(RuleError, match="ad_id 'ad-2' is not in this key's scope"):
        Rule.create(name="ad", measure="ctr", where=("ad_id", "ad-2"), scope=ads)


def test_an_ad_scoped_rule_counts_its_ads_only_whatever_where_and_per_say() -> None:
    """Issue 66, finding 4: a key limited to cmp-1's ad-1 made a rule on cmp-1 per ad_id and
    read every other ad's tests; its rule now counts the rows of its scope only."""
    scope = Scope.create(["cmp-1"], ["ad-2"])
    rule = Rule.create(
        name="mine", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id", scope=scope
    )
    assert dimensions_of([rule]) == ("ad_id", "campaign_id")
    findings = evaluate([rule], _traffic(rule, "ad-2"), END)
    assert [(f.group, f.significant) for f in findings] == [("ad-2", True)]
    whole = Rule.create(name="all", measure="ctr", where=("campaign_id", "cmp-1"), scope=scope)
    (finding,) = evaluate([whole], _traffic(whole, "ad-2"), END)
    assert finding.trials == 10_000  # ad-2's impressions alone, not cmp-1's 20,050
    # A campaign-scoped rule on an ad counts that ad's rows of its campaigns only: an ad id of
    # another advertiser's campaign finds nothing.
    theirs = Rule.create(
        name="t", measure="ctr", where=("ad_id", "ad-9"), scope=Scope.create(["cmp-1"])
    )
    assert evaluate([theirs], _traffic(theirs, "ad-1"), END) == []


def test_hysteresis_fires_on_a_streak_and_a_flapping_measure_pages_once() -> None:
    from alerts.hysteresis import Hysteresis

    state = Hysteresis(fire_after=2, resolve_after=3)
    flapping = [True, False, True, True, False, True, False, True, False, False, False, True]
    transitions = [state.update(True, s) for s in flapping]
    assert transitions == [
        None, None, None, "fired", None, None, None, None, None, None, "resolved", None
    ]  # fmt: skip
    assert state.update(False, True) is None  # too little data: no streak either way
    assert state.significant_streak == 1
