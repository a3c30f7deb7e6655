"""The synthetic traffic model (pure logic: no broker)."""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace as struct_replace

from events.model import Event, validate
from ingest.ground_truth import GroundTruth, format_bucket, read_csv
from ingest.traffic import Record, TrafficConfig, TrafficGenerator

START_MS = 1_790_000_000_000


def take(config: TrafficConfig, n: int) -> list[Record]:
    return list(itertools.islice(TrafficGenerator(config), n))


def test_a_seed_and_start_fix_the_stream() -> None:
    config = TrafficConfig(
        seed=11,
        start_ms=START_MS,
        duplicate_fraction=0.1,
        late_fraction=0.1,
        malformed_fraction=0.1,
    )
    first = [r.value for r in take(config, 3000)]
    assert first == [r.value for r in take(config, 3000)]
    assert first != [r.value for r in take(config.with_seed(12), 3000)]


def test_events_are_valid_and_clicks_follow_their_impression() -> None:
    records = take(TrafficConfig(seed=1, start_ms=START_MS, late_fraction=0.2), 30_000)
    impressions: dict[str, Event] = {}
    clicks = 0
    placement = operator.attrgetter("ad_id", "site_id", "country")  # a click's is its impression's
    for record in records:
        event = validate(record.value, START_MS + 10**8)
        assert isinstance(event, Event)
        assert event == record.event
        if event.event_type == "impression":
            impressions[event.impression_id] = event
        else:
            clicks += 1
            impression = impressions[event.impression_id]  # emitted earlier
            assert impression.event_time < event.event_time
            assert placement(impression) == placement(event)
            assert record.emit_ms >= impression.event_time
    # True CTRs between 0.2 % and 5 %, so overall between those bounds too.
    assert 0.002 < clicks / len(impressions) < 0.05


def test_popularity_is_skewed_and_mixes_look_real() -> None:
    records = take(TrafficConfig(seed=3, start_ms=START_MS), 20_000)
    campaigns = Counter(r.event.campaign_id for r in records if r.event)
    devices = Counter(r.event.device_type for r in records if r.event)
    top, *_, bottom = [n for _, n in campaigns.most_common()]
    assert top > 5 * bottom  # Zipf-like, not uniform
    assert devices.most_common(1)[0][0] == "mobile"
    assert set(devices) <= {"mobile", "desktop", "tablet", "ctv", "other"}


@pytest.mark.parametrize("kind", ["duplicate_fraction", "late_fraction", "malformed_fraction"])
def test_fractions_are_honoured(kind: str) -> None:
    change: dict[str, Any] = {kind: 0.1}
    config = dataclasses.replace(TrafficConfig(seed=5, start_ms=START_MS), **change)
    records = take(config, 20_000)
    if kind == "late_fraction":
        share = sum(r.late for r in records) / len(records)
        assert all(r.emit_ms - r.event.event_time >= 300_000 for r in records if r.late and r.event)
    else:
        label = "duplicate" if kind == "duplicate_fraction" else "malformed"
        share = sum(r.kind == label for r in records) / len(records)
    assert share == pytest.approx(0.1, abs=0.01)


def test_malformed_records_are_all_invalid() -> None:
    records = take(TrafficConfig(seed=9, start_ms=START_MS, malformed_fraction=0.5), 5000)
    bad = [r for r in records if r.kind == "malformed"]
    assert len(bad) > 2000
    assert all(not isinstance(validate(r.value, START_MS + 10**8), Event) for r in bad)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("duplicate_fraction", 1.0, "duplicate_fraction must be in"),
        ("late_fraction", -0.1, "late_fraction must be in"),
        ("events_per_second", 0.0, "events_per_second must be positive"),
        ("campaigns", 0, "campaigns must be at least 1"),
    ],
)
def test_bad_configuration_is_refused(field: str, value: float, message: str) -> None:
    change: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TrafficConfig(seed=1, start_ms=START_MS), **change)


def test_ground_truth_counts_per_minute_bucket_and_round_trips(tmp_path: Path) -> None:
    truth = GroundTruth()
    base = Event(
        event_id="1",
        event_type="impression",
        event_time=0,
        impression_id="i",
        ad_id="a",
        campaign_id="c",
        site_id="s",
        country="US",
        device_type="mobile",
        user_id="u",
        schema_version=1,
    )
    minute = START_MS - START_MS % 60_000
    truth.add(struct_replace(base, event_time=minute))
    truth.add(struct_replace(base, event_id="2", event_time=minute + 59_999))
    truth.add(struct_replace(base, event_id="3", event_type="click", event_time=minute + 60_000))
    path = tmp_path / "truth.csv"
    assert truth.write_csv(path) == 2
    assert path.read_text().splitlines()[1] == f"{format_bucket(minute)},c,a,s,US,mobile,2,0"
    assert read_csv(path) == {
        (minute, "c", "a", "s", "US", "mobile"): (2, 0),
        (minute + 60_000, "c", "a", "s", "US", "mobile"): (0, 1),
    }


def test_ground_truth_spilled_to_disk_sums_to_the_same_file(tmp_path: Path) -> None:
    """A long stream's counts leave memory in partial rows; the file written is the one a
    truth held wholly in memory writes."""
    config = TrafficConfig(seed=4, start_ms=START_MS, events_per_second=500, late_fraction=0.2)
    events = [r.event for r in itertools.islice(TrafficGenerator(config), 5_000) if r.event]
    whole, spilled = GroundTruth(), GroundTruth(spill=tmp_path / "partial.csv", spill_keys=50)
    for event in events:
        whole.add(event)
        spilled.add(event)
    assert spilled.spilled_rows > 0
    assert len(spilled.counts) <= 50
    assert (spilled.impressions, spilled.clicks) == (whole.impressions, whole.clicks)
    expected, actual = tmp_path / "whole.csv", tmp_path / "spilled.csv"
    assert spilled.write_csv(actual) == whole.write_csv(expected)
    assert actual.read_text() == expected.read_text()
    assert not (tmp_path / "partial.csv").exists()


def _clicks_per_ad(config: TrafficConfig) -> tuple[Counter[str], Counter[str]]:
    impressions: Counter[str] = Counter()
    clicks: Counter[str] = Counter()
    for record in take(config, 60_000):
        if record.event is not None:
            kind = impressions if record.event.event_type == "impression" else clicks
            kind[record.event.ad_id] += 1
    return impressions, clicks


def test_an_injected_ctr_drop_changes_that_ad_alone() -> None:
    config = TrafficConfig(seed=5, start_ms=START_MS, campaigns=2, ads_per_campaign=2)
    impressions, clicks = _clicks_per_ad(config)
    broken = dataclasses.replace(config, ctr_factors=(("ad-001-01", 0.0),))
    impressions_after, clicks_after = _clicks_per_ad(broken)
    assert clicks["ad-001-01"] > 0
    assert clicks_after["ad-001-01"] == 0  # click tracking broken
    assert impressions_after["ad-001-01"] > 0
    # Every ad is shown as often as before (a click's own draws shift the random stream: the
    # counts move within noise), and the other ads' true CTRs are the same.
    for ad in impressions:
        assert abs(impressions_after[ad] - impressions[ad]) <= 0.05 * impressions[ad]
    before = {ad.ad_id: ad.ctr for ad in TrafficGenerator(config)._ads.items}
    after = {ad.ad_id: ad.ctr for ad in TrafficGenerator(broken)._ads.items}
    assert after == {**before, "ad-001-01": 0.0}
    halved = dataclasses.replace(config, ctr_factors=(("cmp-002", 0.5),))
    campaign = {ad.ad_id: ad.ctr for ad in TrafficGenerator(halved)._ads.items}
    assert campaign == {ad: c * (0.5 if ad.startswith("ad-002") else 1) for ad, c in before.items()}


@pytest.mark.parametrize(
    ("factors", "message"),
    [
        ((("ad-009-01", 0.5),), "none of the stream's ads"),
        ((("cmp-001", -1.0),), "must be in [0, 10]"),
    ],
)
def test_a_bad_injected_change_is_refused(
    factors: tuple[tuple[str, float], ...], message: str
) -> None:
    with pytest.raises(ValueError, match="ctr_factors") as refused:
        TrafficConfig(seed=1, start_ms=START_MS, campaigns=2, ctr_factors=factors)
    assert message in str(refused.value)


def test_streams_of_other_seeds_show_the_same_ads_the_same_way() -> None:
    """A second stream (an injected change's) mixes with the first without moving any other
    ad's CTR: the catalog (each ad's CTR, the sites' popularity) does not follow the seed."""
    first = TrafficGenerator(TrafficConfig(seed=1, start_ms=START_MS))
    second = TrafficGenerator(TrafficConfig(seed=2, start_ms=START_MS))
    assert [a.ctr for a in first._ads.items] == [a.ctr for a in second._ads.items]
    assert first._sites.items == second._sites.items
    assert [r.value for r in take(first.config, 100)] != [r.value for r in take(second.config, 100)]
