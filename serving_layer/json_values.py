"""Query result values as JSON-ready values (the SQL sandbox's answers, ``ctr sql`` output)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import uuid
from typing import Final

# JSON numbers beyond 64 bits lose their value in most clients (and orjson refuses them).
_INT_RANGE: Final = range(-(2**63), 2**63)


def jsonable(value: object) -> object:
    """A DuckDB result value as JSON: times ISO-8601 (UTC), bytes as text (invalid UTF-8
    base64, marked), decimals, non-finite floats and integers beyond 64 bits as strings,
    nested values recursively."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if value in _INT_RANGE else str(value)
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
