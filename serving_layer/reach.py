"""Reach and frequency of a CTR row: distinct users, exact where the batch layer can say it,
else a sketch estimate with its bounds.

Per row (a bucket and group of :func:`serving_layer.ctr_sql.ctr_sql`), from what
:func:`serving_layer.ctr_sql.reach_sql` found for the same key:

- **exact** (``source`` "batch": every minute covered by a batch run, no late arrival since):
  the distinct users of the batch rows' user lists, under any group-by and filters;
- **stale** (covered, late arrivals not recomputed yet): the batch rows' distinct users, which
  the late events may add to: at least that, at most that plus one user per late event;
- **estimated** (speed or mixed buckets): the union of every row's sketch (batch rows in
  covered minutes, speed rows elsewhere: :mod:`views.sketches`), with its bounds of
  :data:`views.sketches.STD_DEVS` standard errors;
- **not measured** (null): a row written before reach was measured has no list or sketch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, NamedTuple

from lake.coverage.model import Source
from views import sketches


@dataclass(frozen=True)
class Reach:
    """Distinct users of a row: ``reach`` (with an impression) within [``low``, ``high``],
    ``clicking_users`` (with a click), ``frequency`` (impressions per user reached);
    ``exact`` when the batch layer counted them exactly. None: not measured."""

    reach: int | None
    low: int | None
    high: int | None
    exact: bool
    clicking_users: int | None
    frequency: float | None


class ReachFound(NamedTuple):
    """What :func:`serving_layer.ctr_sql.reach_sql` found for a row's key: the exact distinct
    ``users`` and ``clickers`` of its batch rows' lists, whether every row is ``listed``, every
    row's sketches, and how many rows have events but no sketch (``unsketched``)."""

    users: int
    clickers: int
    listed: bool
    reach_sketches: list[bytes] | None
    clicker_sketches: list[bytes] | None
    unsketched: int


NOT_MEASURED: Final = Reach(None, None, None, False, None, None)
# What reach_sql finds for a key without rows (a bucket of late arrivals only): no users.
_NO_ROWS: Final = ReachFound(0, 0, True, [], [], 0)


def reach_of(
    found: ReachFound | None, source: Source, impressions: int, stale_events: int
) -> Reach:
    """The reach of a row with ``source``, ``impressions`` and ``stale_events`` from
    ``found``, what reach_sql found for its key (None: no row)."""
    users, clickers, listed, reach_sketches, clicker_sketches, unsketched = found or _NO_ROWS
    if listed and source in ("batch", "stale"):
        counted, clicking = int(users), int(clickers)
        high = counted + stale_events if source == "stale" else counted
        return Reach(
            counted, counted, high, source == "batch", clicking, _per_user(impressions, counted)
        )
    if unsketched:
        return NOT_MEASURED
    # DuckDB's list of no values is null.
    estimate = sketches.union(reach_sketches or [])
    clicking_estimate = sketches.union(clicker_sketches or [])
    value = round(estimate.value)
    return Reach(
        value,
        min(value, math.floor(estimate.low)),
        max(value, math.ceil(estimate.high)),
        False,
        round(clicking_estimate.value),
        _per_user(impressions, value),  # the reach reported: impressions / reach, as shown
    )


def _per_user(impressions: int, users: float) -> float | None:
    return impressions / users if users > 0 else None
