"""Time, the way the whole platform counts it: UTC, microseconds since the epoch, and the
bounds of "all time" (what the API accepts and what an unbounded diff or build spans)."""

from __future__ import annotations

import datetime as dt
from typing import Final

EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# All time: the earliest and latest times a query, a diff or a build may name.
EARLIEST: Final = EPOCH
LATEST: Final = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


def utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; a time without an offset is taken as UTC already."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def from_micros(micros: int) -> dt.datetime:
    """The UTC time ``micros`` microseconds after the epoch."""
    return EPOCH + dt.timedelta(microseconds=micros)
