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
from typing import Any, Final

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
COUNTS: Final = ("impressions", "clicks")
BUCKET_MS: Final = 60_000

Key = tuple[int, str, str, str, str, str]


class GroundTruth:
    """Counts per (bucket_start_ms, campaign_id, ad_id, site_id, country, device_type).

    With ``spill``, a long stream's counts do not stay in memory: once ``spill_keys`` keys are
    held, they are appended to that file (partial counts) and forgotten; :meth:`write_csv`
    sums the partial rows per key (DuckDB, which spills to disk too) and deletes the file."""

    def __init__(self, *, spill: Path | None = None, spill_keys: int = 200_000) -> None:
        self.counts: dict[Key, list[int]] = {}
        self.spill = spill
        self.spill_keys = spill_keys
        self.spilled_rows = 0
        self.impressions = 0
        self.clicks = 0
        if spill is not None:
            spill.unlink(missing_ok=True)

    def add(self, event: Event) -> None:
        key = _key(event)
        cell = self.counts.get(key)
        if cell is None:
            if self.spill is not None and len(self.counts) >= self.spill_keys:
                self._spill()
            cell = self.counts[key] = [0, 0]
        if event.event_type == "impression":
            cell[0] += 1
            self.impressions += 1
        else:
            cell[1] += 1
            self.clicks += 1

    def _spill(self) -> None:
        assert self.spill is not None
        self.spill.parent.mkdir(parents=True, exist_ok=True)
        with self.spill.open("a", newline="") as handle:
            self.spilled_rows += _write_rows(csv.writer(handle), self.rows())
        self.counts.clear()

    def rows(self) -> Iterator[tuple[int, str, str, str, str, str, int, int]]:
        """The counts in memory (not the spilled ones), sorted by key."""
        for key in sorted(self.counts):
            impressions, clicks = self.counts[key]
            yield (*key, impressions, clicks)

    def write_csv(self, path: Path) -> int:
        """Write the counts as CSV (bucket_start in ISO-8601 UTC), a row per key sorted by
        key; returns the row count."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.spill is not None and self.spilled_rows:
            self._spill()
            return _sum_spilled(self.spill, path)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            return _write_rows(writer, self.rows())


def _write_rows(writer: Any, rows: Iterable[tuple[int, str, str, str, str, str, int, int]]) -> int:
    written = 0
    for bucket_ms, *dims, impressions, clicks in rows:
        writer.writerow([format_bucket(bucket_ms), *dims, impressions, clicks])
        written += 1
    return written


def _sum_spilled(spill: Path, path: Path) -> int:
    """Sum the partial rows of ``spill`` per key into ``path`` (with a header), delete
    ``spill``; returns the rows written."""
    import duckdb

    columns = ", ".join(f"'{c}': '{'BIGINT' if c in COUNTS else 'VARCHAR'}'" for c in COLUMNS)
    key = ", ".join(c for c in COLUMNS if c not in COUNTS)
    with duckdb.connect() as db:
        db.execute(
            f"""COPY (
                SELECT {key}, sum(impressions) AS impressions, sum(clicks) AS clicks
                FROM read_csv(?, header = false, columns = {{{columns}}})
                GROUP BY {key} ORDER BY {key}
            ) TO '{_sql_string(path)}' (HEADER, DELIMITER ',')""",
            [str(spill)],
        )
        row = db.execute("SELECT count(*) FROM read_csv(?, header = true)", [str(path)]).fetchone()
    spill.unlink()
    return int(row[0]) if row else 0


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")


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
    """Read a ground-truth file back into {key: (impressions, clicks)} (rows of the same key
    summed)."""
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
            impressions, clicks = result.get(key, (0, 0))
            result[key] = (impressions + int(row["impressions"]), clicks + int(row["clicks"]))
    return result
