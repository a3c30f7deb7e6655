"""Times in request parameters: the API speaks UTC."""

from __future__ import annotations

import datetime as dt

from api.errors import ParameterError


def as_utc(value: dt.datetime, parameter: str) -> dt.datetime:
    """``value`` in UTC (a time without an offset is taken as UTC), or a 400 naming
    ``parameter`` when UTC has no such time (0001-01-01T00:00:00+14:00 is in the year 0)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ParameterError(
            parameter,
            f"{value.isoformat()} is out of range: in UTC it is before year 1 or after 9999",
        ) from None
