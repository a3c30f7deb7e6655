"""Synthetic ad traffic: realistic enough to exercise every layer, exact enough to test them.

Campaigns, ads and sites have Zipf-like popularity; countries and devices follow a skewed mix;
each ad has a true CTR between 0.2 % and 5 %; a click follows its impression after seconds to
minutes. On request the stream carries duplicates (the same record resent), late events
(event_time minutes to hours old) and malformed records, each at its configured share of all
records; repeated clicks (a clicked impression clicked again, seconds later) and orphan clicks
(a click naming an impression never sent), each at its share of the clicks. Everything is
drawn from one seeded RNG, so a seed and a start time fix the stream.

The generator keeps a virtual clock that advances ``1 / events_per_second`` per record; the
caller paces it against the wall clock (``ctr produce --rate``) or not.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from bisect import bisect
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final, Generic, Literal, TypeVar

import msgspec
import orjson
from msgspec.structs import replace as struct_replace

from events.model import DeviceType, Event

RecordKind = Literal["event", "duplicate", "malformed"]

# Country and device mixes of a typical global display campaign (shares, not exact figures).
COUNTRY_MIX: Final = {
    "US": 30, "IN": 9, "GB": 7, "DE": 6, "BR": 6, "FR": 5, "JP": 5, "CA": 4, "MX": 3, "ES": 3,
    "IT": 3, "AU": 3, "NL": 2, "PL": 2, "ID": 2, "KR": 2, "SE": 1, "TR": 1, "ZA": 1, "NG": 1,
}  # fmt: skip
DEVICE_MIX: Final[dict[DeviceType, int]] = {
    "mobile": 58,
    "desktop": 30,
    "tablet": 6,
    "ctv": 4,
    "other": 2,
}

MALFORMED_KINDS: Final = (
    "not_json",
    "truncated_json",
    "binary_garbage",
    "json_array",
    "missing_field",
    "wrong_type",
    "unknown_event_type",
    "bad_country",
    "oversize_string",
    "far_future",
    "ancient",
)


@dataclass(frozen=True)
class TrafficConfig:
    """Shape of the generated traffic. Fractions are shares of all records produced."""

    seed: int
    start_ms: int
    events_per_second: float = 1000.0  # event-time rate of the virtual clock
    campaigns: int = 20
    ads_per_campaign: int = 8
    sites: int = 300
    users: int = 200_000
    zipf_exponent: float = 1.1
    min_ctr: float = 0.002
    max_ctr: float = 0.05
    click_delay_s: tuple[float, float] = (2.0, 300.0)
    # Late by more than the longest click delay, so a late click is late too.
    late_delay_s: tuple[float, float] = (600.0, 3 * 3600.0)
    duplicate_fraction: float = 0.0
    late_fraction: float = 0.0
    malformed_fraction: float = 0.0
    # Shares of the clicks: clicked once more (seconds after the click), and followed by a
    # click naming an impression nobody sent.
    repeat_click_fraction: float = 0.0
    orphan_click_fraction: float = 0.0
    # A change injected into this stream (`ctr produce --ctr-drop`): each (id, factor) multiplies
    # the CTR of the ad with that id, or of every ad of the campaign with that id (0: a click
    # tracking break).
    ctr_factors: tuple[tuple[str, float], ...] = ()
    # The ad catalog's seed: each ad's true CTR and the sites' popularity. Streams of other
    # seeds (`ctr produce --seed`) share it, so a second stream, an injected change's, shows
    # the same ads the same way.
    catalog_seed: int = 0

    def __post_init__(self) -> None:
        fractions = ("duplicate_fraction", "late_fraction", "malformed_fraction")
        for name in (*fractions, "repeat_click_fraction", "orphan_click_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.duplicate_fraction + self.malformed_fraction >= 1.0:
            raise ValueError("duplicate_fraction + malformed_fraction must be below 1")
        if self.events_per_second <= 0:
            raise ValueError(f"events_per_second must be positive, got {self.events_per_second}")
        for name in ("campaigns", "ads_per_campaign", "sites", "users"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.min_ctr <= self.max_ctr < 1:
            raise ValueError("need 0 < min_ctr <= max_ctr < 1")
        for target, factor in self.ctr_factors:
            if not 0 <= factor <= 10:
                raise ValueError(f"ctr_factors: {target}'s factor must be in [0, 10], got {factor}")
            if not self._names(target):
                raise ValueError(
                    f"ctr_factors: {target!r} is none of the stream's ads (ad-001-01 … "
                    f"ad-{self.campaigns:03d}-{self.ads_per_campaign:02d}) or campaigns "
                    f"(cmp-001 … cmp-{self.campaigns:03d})"
                )

    def _names(self, target: str) -> bool:
        campaigns = {f"cmp-{c:03d}" for c in range(1, self.campaigns + 1)}
        ads = {
            f"ad-{c:03d}-{a:02d}"
            for c in range(1, self.campaigns + 1)
            for a in range(1, self.ads_per_campaign + 1)
        }
        return target in campaigns or target in ads

    def with_seed(self, seed: int) -> TrafficConfig:
        return replace(self, seed=seed)


class Record(msgspec.Struct, frozen=True):
    """One Kafka record to send. ``event`` is set for valid events and their duplicates."""

    value: bytes
    key: bytes | None
    kind: RecordKind
    emit_ms: int
    event: Event | None = None
    late: bool = False


@dataclass(frozen=True, slots=True)
class _Ad:
    ad_id: str
    campaign_id: str
    ctr: float


_T = TypeVar("_T")


class _Weighted(Generic[_T]):
    """Fast repeated weighted choice by bisecting cumulative weights."""

    def __init__(self, items: list[_T], weights: list[float]) -> None:
        self.items = items
        self.cumulative = list(itertools.accumulate(weights))
        self.total = self.cumulative[-1]

    def pick(self, rng: random.Random) -> _T:
        return self.items[bisect(self.cumulative, rng.random() * self.total)]


def _zipf(n: int, exponent: float) -> list[float]:
    return [1.0 / (rank**exponent) for rank in range(1, n + 1)]


class TrafficGenerator:
    """An endless, deterministic stream of :class:`Record` in emit order."""

    def __init__(self, config: TrafficConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        catalog = random.Random(config.catalog_seed)
        factors = dict(config.ctr_factors)
        ads = [
            _Ad(
                ad_id=f"ad-{c:03d}-{a:02d}",
                campaign_id=f"cmp-{c:03d}",
                # log-uniform: most ads click rarely, a few do well
                ctr=math.exp(catalog.uniform(math.log(config.min_ctr), math.log(config.max_ctr)))
                * factors.get(f"ad-{c:03d}-{a:02d}", factors.get(f"cmp-{c:03d}", 1.0)),
            )
            for c in range(1, config.campaigns + 1)
            for a in range(1, config.ads_per_campaign + 1)
        ]
        campaign_weight = _zipf(config.campaigns, config.zipf_exponent)
        ad_rank = _zipf(config.ads_per_campaign, config.zipf_exponent)
        ad_weights = [
            campaign_weight[c] * ad_rank[a]
            for c in range(config.campaigns)
            for a in range(config.ads_per_campaign)
        ]
        self._ads = _Weighted(ads, ad_weights)
        sites = [f"site-{s:04d}" for s in range(1, config.sites + 1)]
        catalog.shuffle(sites)  # popularity is not alphabetical
        self._sites = _Weighted(sites, _zipf(config.sites, config.zipf_exponent))
        self._countries = _Weighted(list(COUNTRY_MIX), [float(w) for w in COUNTRY_MIX.values()])
        self._devices = _Weighted(list(DEVICE_MIX), [float(w) for w in DEVICE_MIX.values()])
        self._step_ms = 1000.0 / config.events_per_second
        self._emitted = 0
        self._pending: list[tuple[int, int, Record]] = []  # (due_ms, seq, record): clicks
        self._seq = itertools.count()
        self._recent: deque[Record] = deque(maxlen=2000)  # candidates for a resend

    @property
    def clock_ms(self) -> int:
        return self.config.start_ms + int(self._emitted * self._step_ms)

    def __iter__(self) -> Iterator[Record]:
        return self

    def __next__(self) -> Record:
        now = self.clock_ms
        self._emitted += 1
        roll = self.rng.random()
        cfg = self.config
        if roll < cfg.malformed_fraction:
            return self._malformed(now)
        if roll < cfg.malformed_fraction + cfg.duplicate_fraction and self._recent:
            original = self._recent[int(self.rng.random() * len(self._recent))]
            return struct_replace(original, kind="duplicate", emit_ms=now)
        if self._pending and self._pending[0][0] <= now:
            record = struct_replace(heapq.heappop(self._pending)[2], emit_ms=now)
        else:
            record = self._impression(now)
        self._recent.append(record)
        return record

    def _impression(self, now: int) -> Record:
        rng = self.rng
        cfg = self.config
        ad = self._ads.pick(rng)
        late = cfg.late_fraction > 0 and rng.random() < cfg.late_fraction
        event_time = now
        if late:
            event_time = now - int(_log_uniform(rng, *cfg.late_delay_s) * 1000)
        impression_id = f"imp-{rng.getrandbits(96):024x}"
        event = Event(
            event_id=f"evt-{rng.getrandbits(96):024x}",
            event_type="impression",
            event_time=event_time,
            impression_id=impression_id,
            ad_id=ad.ad_id,
            campaign_id=ad.campaign_id,
            site_id=self._sites.pick(rng),
            country=self._countries.pick(rng),
            device_type=self._devices.pick(rng),
            user_id=f"user-{rng.randrange(cfg.users):07d}",
            schema_version=1,
        )
        if rng.random() < ad.ctr:
            click_time = event_time + int(_log_uniform(rng, *cfg.click_delay_s) * 1000)
            click = struct_replace(
                event,
                event_id=f"evt-{rng.getrandbits(96):024x}",
                event_type="click",
                event_time=click_time,
            )
            self._click_later(click, now if late else click_time, late)
            if rng.random() < cfg.repeat_click_fraction:
                again = click_time + int(_log_uniform(rng, 1.0, 30.0) * 1000)
                repeat = struct_replace(
                    click, event_id=f"evt-{rng.getrandbits(96):024x}", event_time=again
                )
                self._click_later(repeat, now if late else again, late)
            if rng.random() < cfg.orphan_click_fraction:
                orphan = struct_replace(
                    click,
                    event_id=f"evt-{rng.getrandbits(96):024x}",
                    impression_id=f"imp-{rng.getrandbits(96):024x}",
                )
                self._click_later(orphan, now if late else click_time, late)
        return Record(event.to_json(), event.key, "event", now, event, late)

    def _click_later(self, click: Event, due: int, late: bool) -> None:
        """Send ``click`` once the clock reaches ``due`` (a late impression's clicks arrive
        late with it; a live one's when they happen)."""
        pending = Record(click.to_json(), click.key, "event", due, click, late)
        heapq.heappush(self._pending, (due, next(self._seq), pending))

    def _malformed(self, now: int) -> Record:
        rng = self.rng
        kind = MALFORMED_KINDS[int(rng.random() * len(MALFORMED_KINDS))]
        base = {
            "event_id": f"bad-{rng.getrandbits(64):016x}",
            "event_type": "impression",
            "event_time": now,
            "impression_id": f"imp-{rng.getrandbits(96):024x}",
            "ad_id": "ad-001-01",
            "campaign_id": "cmp-001",
            "site_id": "site-0001",
            "country": "US",
            "device_type": "mobile",
            "user_id": "user-0000001",
            "schema_version": 1,
        }
        value: bytes
        if kind == "not_json":
            value = b"impression,ad-001-01,US,mobile"
        elif kind == "truncated_json":
            value = orjson.dumps(base)[: rng.randrange(5, 60)]
        elif kind == "binary_garbage":
            value = rng.randbytes(rng.randrange(1, 64))
        elif kind == "json_array":
            value = orjson.dumps(list(base.values()))
        else:
            if kind == "missing_field":
                del base[rng.choice(list(base))]
            elif kind == "wrong_type":
                base["event_time"] = str(now)
            elif kind == "unknown_event_type":
                base["event_type"] = "conversion"
            elif kind == "bad_country":
                base["country"] = "XX"
            elif kind == "oversize_string":
                base["event_id"] = "x" * 100
            elif kind == "far_future":
                base["event_time"] = 4_102_444_800_000  # 2100-01-01: future for any clock
            elif kind == "ancient":
                base["event_time"] = 86_400_000  # 1970-01-02
            value = orjson.dumps(base)
        return Record(value, None, "malformed", now)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))
