"""Exact impressions and clicks per minute bucket and dimensions of what a generator produced.

Duplicates and malformed records are not counted; late events are, in their event-time
bucket. This is what the batch layer must reproduce exactly, so tests and benchmarks compare
against it.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
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
        key = _key(event)
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


def attributed(events: Iterable[Event], window_ms: int) -> dict[Key, tuple[int, ...]]:
    """Version 3 of the view, by its definition, in plain Python: per key (impressions,
    clicks, raw_clicks, orphan_clicks, repeat_clicks) of distinct ``events``.

    A click is credited to the first impression event (event time, then event id) carrying
    its impression id when it happened in [that impression's time, + ``window_ms``]; clicks are
    the impressions with a credited click, in the impression's bucket and dimensions, repeats
    the credited clicks after the first; a click credited to none is an orphan in its own
    bucket; raw clicks are every click in its own bucket.
    """
    first: dict[str, Event] = {}
    for event in events:
        if event.event_type == "impression":
            known = first.get(event.impression_id)
            if known is None or (event.event_time, event.event_id) < (
                known.event_time,
                known.event_id,
            ):
                first[event.impression_id] = event
    cells: dict[Key, list[int]] = {}
    credited: dict[str, int] = {}

    def cell(event: Event) -> list[int]:
        return cells.setdefault(_key(event), [0, 0, 0, 0, 0])

    for event in events:
        if event.event_type == "impression":
            cell(event)[0] += 1
            continue
        cell(event)[2] += 1
        shown = first.get(event.impression_id)
        if shown is None or not 0 <= event.event_time - shown.event_time <= window_ms:
            cell(event)[3] += 1
            continue
        credited[shown.impression_id] = credited.get(shown.impression_id, 0) + 1
    for impression_id, n in credited.items():
        counts = cell(first[impression_id])
        counts[1] += 1
        counts[4] += n - 1
    return {key: tuple(counts) for key, counts in cells.items()}


def _key(event: Event) -> Key:
    return (
        event.event_time - event.event_time % BUCKET_MS,
        event.campaign_id,
        event.ad_id,
        event.site_id,
        event.country,
        event.device_type,
    )


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
