"""The dashboard tests' lake: 50 minutes ending at a fixed instant (:data:`NOW`, where the
pages' clocks start), written as Delta tables, and the numbers the page must show for any
filter.

Batch rows and a finished run cover the first 30 minutes, speed rows the last 30 (the 10
minutes they overlap are covered, so the page must show the batch numbers there). Every minute
has one row per key of :data:`KEYS`; speed counts differ from batch counts, so a wrong merge
shows.

Reach: :class:`Lake` writes the catalog's user list and sketch columns null, as rows the layers
wrote before reach was measured; :class:`ReachLake` writes who every row reached
(:func:`users`); :class:`UnmeasuredLake` writes tables without those columns at all.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from lake.registry import record
from lake.settings import LakeSettings
from serving_layer.wilson import wilson_interval
from tests.support import lake_writer
from views.columns import DIMENSIONS

TOKEN: Final = "dashboard-test-token"
MINUTE: Final = dt.timedelta(minutes=1)
# When the dashboard tests' lakes are written, and when their pages start (the ``page``
# fixture sets the browser's clock to it): a minute's start, so no page crosses into the next
# minute before the test has had a minute, whatever the machine's clock says.
NOW: Final = dt.datetime(2026, 11, 27, 9, 30, tzinfo=dt.UTC)
# (campaign, ad, site, country, device) of the rows written for every minute.
KEYS: Final = [
    ("c1", "a1", "s1", "US", "mobile"),
    ("c2", "a2", "s1", "DE", "desktop"),
    ("c3", "a3", "s2", "FR", "mobile"),
]
Key = tuple[str, str, str, str, str]
Keep = Callable[[Key], bool]


def everything(_: Key) -> bool:
    return True


def where(**values: str | tuple[str, ...]) -> Keep:
    """Keys whose dimensions (``country="US"``, ``site_id=("s1", "s2")``) have these values."""

    def keep(key: Key) -> bool:
        for name, allowed in values.items():
            value = key[DIMENSIONS.index(name)]
            if value not in (allowed if isinstance(allowed, tuple) else (allowed,)):
                return False
        return True

    return keep


def counts(minute: int, key: int, layer: str) -> tuple[int, int]:
    """Impressions and clicks of one row (``minute``: minutes since the epoch)."""
    minute %= 60
    impressions = 100 + 40 * key + minute
    clicks = (minute * (key + 2)) % 9 + key + 1
    return (impressions + 7, clicks + 1) if layer == "speed" else (impressions, clicks)


def rows(buckets: list[dt.datetime], layer: str) -> list[dict[str, object]]:
    out = []
    for bucket in buckets:
        for k, (campaign, ad, site, country, device) in enumerate(KEYS):
            impressions, clicks = counts(int(bucket.timestamp() // 60), k, layer)
            out.append(
                lake_writer.ctr_row(
                    bucket,
                    impressions,
                    clicks,
                    campaign=campaign,
                    ad=ad,
                    site=site,
                    country=country,
                    device=device,
                )
            )
    return out


class Lake:
    """The Delta tables of the test and the per-minute numbers the page must show."""

    def __init__(self, root: Path, now: dt.datetime) -> None:
        self.settings = LakeSettings(lake_root=root, checkpoint_root=root / "checkpoints")
        self.now = now.replace(second=0, microsecond=0)
        self.batch_minutes = [self.now - (50 - i) * MINUTE for i in range(30)]  # [T-50, T-20)
        self.speed_minutes = [self.now - (30 - i) * MINUTE for i in range(31)]  # [T-30, T]
        self.covered_end = self.batch_minutes[-1] + MINUTE

    @classmethod
    def fresh(cls, root: Path, now: dt.datetime = NOW) -> Lake:
        """A lake written at ``now`` (the pages' clock: :data:`NOW`): the page's "last hour"
        holds every bucket written."""
        lake = cls(root, now)
        lake.write()
        return lake

    def write(self) -> None:
        run_id = "run-dashboard-test"
        self.write_rows(run_id)
        lake_writer.cover(self.settings, run_id, self.batch_minutes[0], self.covered_end)
        lake_writer.write_status(
            self.settings,
            updated_at=self.now.isoformat(),
            watermark=(self.now - 2 * MINUTE).isoformat(),
            offsets_behind=1234,
        )

    def write_rows(self, run_id: str) -> None:
        """The batch rows (of run ``run_id``) and the speed rows, with the catalog's columns:
        user lists and sketches null (reach not measured)."""
        lake_writer.write_batch(self.settings, run_id, rows(self.batch_minutes, "batch"))
        lake_writer.write_speed(self.settings, rows(self.speed_minutes, "speed"))

    def minutes(self) -> list[tuple[dt.datetime, str]]:
        """Every minute with data and the layer the page must show it from."""
        return [
            (bucket, "batch" if bucket < self.covered_end else "speed")
            for bucket in sorted(set(self.batch_minutes) | set(self.speed_minutes))
        ]

    def expected_series(self, keep: Keep = everything) -> list[list[Any]]:
        """[bucket ms, source, impressions, clicks] per minute with data of the kept keys."""
        out: list[list[Any]] = []
        for bucket, layer in self.minutes():
            minute = int(bucket.timestamp() // 60)
            kept = [counts(minute, k, layer) for k, key in enumerate(KEYS) if keep(key)]
            if kept:
                impressions, clicks = sum(c[0] for c in kept), sum(c[1] for c in kept)
                out.append([int(bucket.timestamp() * 1000), layer, impressions, clicks])
        return out

    def totals(self, dimension: str, keep: Keep = everything) -> dict[str, tuple[int, int]]:
        """(impressions, clicks) over the data per value of ``dimension``, kept keys only."""
        sums: dict[str, tuple[int, int]] = {}
        for bucket, layer in self.minutes():
            minute = int(bucket.timestamp() // 60)
            for k, key in enumerate(KEYS):
                if keep(key):
                    value = key[DIMENSIONS.index(dimension)]
                    i, c = counts(minute, k, layer)
                    before = sums.get(value, (0, 0))
                    sums[value] = (before[0] + i, before[1] + c)
        return sums

    def expected_ranking(self, dimension: str, keep: Keep = everything) -> list[str]:
        """Values of ``dimension`` by total clicks, most first (ties: impressions, name)."""
        sums = self.totals(dimension, keep)
        return sorted(sums, key=lambda v: (-sums[v][1], -sums[v][0], v))

    def expected_ctr(self, dimension: str, keep: Keep = everything) -> dict[str, float]:
        return {v: c / i for v, (i, c) in self.totals(dimension, keep).items()}


# The users of the reach lake: each row's are a run of this pool that moves on with the minute,
# so rows share users with their neighbours and with the other keys (reach does not add up).
USER_POOL: Final = 2_000


def users(minute: int, key: int, layer: str) -> list[str]:
    """The distinct users with an impression in one row (``minute``: minutes since the epoch),
    sorted; fewer than its impressions (users see several)."""
    n = 20 + (minute % 60) % 17 + 6 * key + (1 if layer == "speed" else 0)
    first = (13 * minute + 150 * key) % USER_POOL
    return sorted(f"u{(first + j) % USER_POOL:04d}" for j in range(n))


def clickers(minute: int, key: int, layer: str) -> list[str]:
    """The distinct users with a click in one row: as many of its users as it has clicks."""
    return users(minute, key, layer)[: counts(minute, key, layer)[1]]


class ReachLake(Lake):
    """The same minutes and counts, with who every row reached: the batch rows' user lists and
    sketches, the speed rows' sketches (:func:`tests.support.lake_writer.reached`)."""

    def write_rows(self, run_id: str) -> None:
        lake_writer.write_batch(self.settings, run_id, self.reached(self.batch_minutes, "batch"))
        lake_writer.write_speed(self.settings, self.reached(self.speed_minutes, "speed"))

    @staticmethod
    def reached(buckets: list[dt.datetime], layer: str) -> list[dict[str, object]]:
        out = []
        for row in rows(buckets, layer):
            bucket = row["bucket_start"]
            assert isinstance(bucket, dt.datetime)
            minute = int(bucket.timestamp() // 60)
            key = [k[0] for k in KEYS].index(str(row["campaign_id"]))
            out.append(
                lake_writer.reached(
                    row,
                    users(minute, key, layer),
                    clickers(minute, key, layer),
                    lists=layer == "batch",
                )
            )
        return out

    def expected_users(
        self, start: dt.datetime, end: dt.datetime, keep: Keep = everything
    ) -> set[str]:
        """The distinct users of the kept keys in the minutes of [start, end), each minute from
        the layer the page shows it from."""
        found: set[str] = set()
        for bucket, layer in self.minutes():
            if start <= bucket < end:
                minute = int(bucket.timestamp() // 60)
                for k, key in enumerate(KEYS):
                    if keep(key):
                        found.update(users(minute, k, layer))
        return found


class UnmeasuredLake(Lake):
    """The same rows in tables written before reach was measured: no user list or sketch
    columns at all."""

    def write_rows(self, run_id: str) -> None:
        lake_writer.write_batch(
            self.settings,
            run_id,
            rows(self.batch_minutes, "batch"),
            schema=lake_writer.pre_reach_schema("batch/ctr"),
        )
        lake_writer.write_speed(
            self.settings,
            rows(self.speed_minutes, "speed"),
            schema=lake_writer.pre_reach_schema("speed/ctr"),
        )


def attribution(minute: int, key: int, layer: str) -> tuple[int, int]:
    """Orphan and repeat clicks of one row of the version with click attribution; its raw
    clicks are its (attributed) clicks plus both."""
    minute %= 60
    orphans, repeats = (minute + key) % 3, (minute * key) % 2
    return (orphans + 1, repeats) if layer == "speed" else (orphans, repeats)


class AttributedLake(Lake):
    """The same minutes, published as version 3 of ``ctr`` (clicks attributed to their
    impressions): its batch table, coverage rows and the speed rows' attribution counts."""

    def write(self) -> None:
        run_id = "run-dashboard-v3"
        lake_writer.write(
            self.settings,
            "batch/ctr_v3",
            [self.attributed(row, "batch") for row in rows(self.batch_minutes, "batch")],
            run_id=run_id,
        )
        lake_writer.cover(
            self.settings, run_id, self.batch_minutes[0], self.covered_end, view="ctr@v3"
        )
        speed = [self.attributed(row, "speed") for row in rows(self.speed_minutes, "speed")]
        for row in speed:  # speed/ctr: clicks are the click events, attributed_clicks the clicks
            row["attributed_clicks"], row["clicks"] = row["clicks"], row.pop("raw_clicks")
        lake_writer.write_speed(self.settings, speed)
        record(self.settings, "ctr", 3, "published", "dashboard test")

    @staticmethod
    def attributed(row: dict[str, object], layer: str) -> dict[str, object]:
        bucket = row["bucket_start"]
        assert isinstance(bucket, dt.datetime)
        key = [k[0] for k in KEYS].index(str(row["campaign_id"]))
        orphans, repeats = attribution(int(bucket.timestamp() // 60), key, layer)
        clicks = row["clicks"]
        assert isinstance(clicks, int)
        return {
            **row,
            "raw_clicks": clicks + orphans + repeats,
            "orphan_clicks": orphans,
            "repeat_clicks": repeats,
        }

    def attribution_totals(self) -> tuple[int, int, int, int]:
        """Clicks, raw, orphan and repeat clicks over every minute with data."""
        clicks = raw = orphans = repeats = 0
        for bucket, layer in self.minutes():
            minute = int(bucket.timestamp() // 60)
            for k in range(len(KEYS)):
                c = counts(minute, k, layer)[1]
                o, r = attribution(minute, k, layer)
                clicks, raw, orphans, repeats = (
                    clicks + c,
                    raw + c + o + r,
                    orphans + o,
                    repeats + r,
                )
        return clicks, raw, orphans, repeats


def ci(impressions: int, clicks: int) -> tuple[float, float]:
    interval = wilson_interval(clicks, impressions)
    assert interval is not None
    return interval
