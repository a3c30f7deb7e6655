"""Exact impressions and clicks per minute bucket and dimensions of what a generator produced.

Duplicates and malformed records are not counted; late events are, in their event-time
bucket. This is what the batch layer must reproduce exactly, so tests and benchmarks compare
against it.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from events.model import Event

COLUMNS: Final = (
    "bucket_start",
    "campaign_id",
    "ad_id",
    "site_id",
    "country",
    "device_type",
    "impressions",
    "clicks",
)
BUCKET_MS: Final = 60_000

Key = tuple[int, str, str, str, str, str]


class GroundTruth:
    """Counts per (bucket_start_ms, campaign_id, ad_id, site_id, country, device_type)."""

    def __init__(self) -> None:
        self.counts: dict[Key, list[int]] = {}

    def add(self, event: Event) -> None:
        key = (
            event.event_time - event.event_time % BUCKET_MS,
            event.campaign_id,
            event.ad_id,
            event.site_id,
            event.country,
            event.device_type,
        )
        cell = self.counts.get(key)
        if cell is None:
            cell = self.counts[key] = [0, 0]
        cell[0 if event.event_type == "impression" else 1] += 1

    @property
    def impressions(self) -> int:
        return sum(cell[0] for cell in self.counts.values())

    @property
    def clicks(self) -> int:
        return sum(cell[1] for cell in self.counts.values())

    def rows(self) -> Iterator[tuple[int, str, str, str, str, str, int, int]]:
        for key in sorted(self.counts):
            impressions, clicks = self.counts[key]
            yield (*key, impressions, clicks)

    def write_csv(self, path: Path) -> int:
        """Write the counts as CSV (bucket_start in ISO-8601 UTC); returns the row count."""
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = 0
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            for bucket_ms, *dims, impressions, clicks in self.rows():
                writer.writerow([format_bucket(bucket_ms), *dims, impressions, clicks])
                rows += 1
        return rows


def format_bucket(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_csv(path: Path) -> dict[Key, tuple[int, int]]:
    """Read a ground-truth file back into {key: (impressions, clicks)}."""
    result: dict[Key, tuple[int, int]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            bucket = datetime.strptime(row["bucket_start"], "%Y-%m-%dT%H:%M:%SZ")
            bucket_ms = int(bucket.replace(tzinfo=UTC).timestamp() * 1000)
            key = (
                bucket_ms,
                row["campaign_id"],
                row["ad_id"],
                row["site_id"],
                row["country"],
                row["device_type"],
            )
            result[key] = (int(row["impressions"]), int(row["clicks"]))
    return result
