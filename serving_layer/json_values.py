"""Query result values as JSON-ready values (the SQL sandbox's answers, ``ctr sql`` output)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import uuid
from collections.abc import Callable
from types import UnionType
from typing import Any, Final

# JSON numbers beyond 64 bits lose their value in most clients (and orjson refuses them).
_INT_RANGE: Final = range(-(2**63), 2**63)


def jsonable(value: object) -> object:
    """A DuckDB result value as JSON: times ISO-8601 (UTC), bytes as text (invalid UTF-8
    base64, marked), decimals, non-finite floats and integers beyond 64 bits as strings,
    nested values recursively."""
    if value is None or isinstance(value, bool | str):
        return value
    for kind, convert in _CONVERTERS:
        if isinstance(value, kind):
            return convert(value)
    return str(value)


def _int(value: int) -> int | str:
    return value if value in _INT_RANGE else str(value)


def _float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _datetime(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.isoformat().replace("+00:00", "Z")


def _isoformat(value: dt.date | dt.time) -> str:
    return value.isoformat()


def _bytes(value: bytes | bytearray | memoryview) -> str:
    raw = bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")


def _dict(value: dict[object, object]) -> dict[str, object]:
    return {str(k): jsonable(v) for k, v in value.items()}


def _sequence(value: list[object] | tuple[object, ...] | set[object]) -> list[object]:
    return [jsonable(v) for v in value]


# In order: the first match converts (bool and str are handled before; datetime before date).
_CONVERTERS: Final[tuple[tuple[type | UnionType, Callable[[Any], object]], ...]] = (
    (int, _int),
    (float, _float),
    (dt.datetime, _datetime),
    (dt.date | dt.time, _isoformat),
    (dt.timedelta | decimal.Decimal | uuid.UUID, str),
    (bytes | bytearray | memoryview, _bytes),
    (dict, _dict),
    (list | tuple | set, _sequence),
)
