"""The time intervals batch runs cover: [start, end), UTC, whole minutes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

from batch_layer.errors import BatchError


class IntervalError(BatchError, ValueError):
    """An interval a batch run cannot cover."""


@dataclass(frozen=True, order=True)
class Interval:
    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        _check(self.start, self.end, ("start", "end"))

    @classmethod
    def parse(cls, start: str, end: str, *, names: tuple[str, str] = ("start", "end")) -> Interval:
        """The interval [start, end) from ISO-8601 text; an error names the bounds by ``names``
        (the flags the user typed, e.g. ``--from``/``--to``)."""
        first, second = parse_time(start, names[0]), parse_time(end, names[1])
        _check(first, second, names)
        return cls(first, second)

    @property
    def days(self) -> list[dt.date]:
        """The event_date partitions the interval touches."""
        last = (self.end - dt.timedelta(microseconds=1)).date()
        return [
            self.start.date() + dt.timedelta(days=n)
            for n in range((last - self.start.date()).days + 1)
        ]

    def before(self, moment: dt.datetime) -> Interval | None:
        """The part of the interval before ``moment`` (a whole minute); None if there is none."""
        if moment <= self.start:
            return None
        return self if self.end <= moment else Interval(self.start, moment)

    def hours(self) -> Iterator[Interval]:
        """The interval cut at hour boundaries (the unit of `ctr backfill`)."""
        cursor = self.start
        while cursor < self.end:
            step = (cursor + dt.timedelta(hours=1)).replace(minute=0)
            yield Interval(cursor, min(step, self.end))
            cursor = min(step, self.end)

    def sql_predicate(self, column: str) -> str:
        """``column`` in [start, end), as SQL with timestamp literals (no user text)."""
        return (
            f"{column} >= TIMESTAMP '{_sql_time(self.start)}' "
            f"AND {column} < TIMESTAMP '{_sql_time(self.end)}'"
        )

    def delta_predicate(self, column: str) -> str:
        """``column`` in [start, end) as a delta-rs predicate (:func:`delta_rs_timestamp`)."""
        from lake.coverage.model import delta_rs_timestamp

        return (
            f"{column} >= {delta_rs_timestamp(self.start)} "
            f"AND {column} < {delta_rs_timestamp(self.end)}"
        )

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


def _check(start: dt.datetime, end: dt.datetime, names: tuple[str, str]) -> None:
    """That [start, end) can be covered: UTC whole minutes, end after start; an error names
    the bounds by ``names``."""
    for name, value in zip(names, (start, end), strict=True):
        if value.tzinfo is None:
            raise IntervalError(f"{name} must be timezone-aware (UTC), got {value}")
        if value.second or value.microsecond:
            raise IntervalError(f"{name} must be a whole minute, got {value.isoformat()}")
    if end <= start:
        raise IntervalError(
            f"{names[1]} ({end.isoformat()}) must be after {names[0]} ({start.isoformat()})"
        )


def parse_time(text: str, name: str) -> dt.datetime:
    """ISO-8601 (a bare date means midnight); no offset means UTC."""
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise IntervalError(
            f"{name}: {text!r} is not an ISO-8601 time like 2026-11-22T10:00:00Z"
        ) from None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _sql_time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S+00:00")
