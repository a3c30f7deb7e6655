"""Domain values as JSON-ready values."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import uuid

from serving_layer import Freshness


def freshness_json(freshness: Freshness) -> dict[str, object]:
    return {
        "latest_covered_bucket": freshness.latest_covered_bucket,
        "latest_speed_bucket": freshness.latest_speed_bucket,
        "speed_updated_at": freshness.speed_updated_at,
        "speed_watermark": freshness.speed_watermark,
        "speed_lag_records": freshness.speed_lag_records,
        "versions": freshness.versions,
    }


def jsonable(value: object) -> object:
    """A DuckDB result value as JSON: times ISO-8601 (UTC), bytes as text (invalid UTF-8
    escaped), decimals and non-finite floats as strings, nested values recursively."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    return str(value)
