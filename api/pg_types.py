"""DuckDB's result types as PostgreSQL's: each column's type OID and name, and its values as
the Python values the wire encodes (text or binary, as the client asks).

The SQL sandbox answers in JSON-ready values (:func:`serving_layer.json_values.jsonable`:
times as ISO-8601 strings, decimals and integers past 64 bits as strings, bytes as UTF-8 text
or ``base64:``-marked); here each goes back to the value its DuckDB type had, so a timestamp
with time zone reaches a client as ``timestamptz``, a decimal as ``numeric`` with its scale, a
sealed sketch as ``bytea``. A type PostgreSQL has no counterpart for (a struct, a map, a
union) goes as ``json``; an enum, a bit string and a time with time zone as ``text``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

# PostgreSQL's type OIDs (pg_type.oid; the same in every release).
BOOL: Final = 16
BYTEA: Final = 17
INT8: Final = 20
INT2: Final = 21
INT4: Final = 23
TEXT: Final = 25
JSON: Final = 114
FLOAT4: Final = 700
FLOAT8: Final = 701
DATE: Final = 1082
TIME: Final = 1083
TIMESTAMP: Final = 1114
TIMESTAMPTZ: Final = 1184
INTERVAL: Final = 1186
NUMERIC: Final = 1700
UUID: Final = 2950

# Each scalar type's array type, as pg_type's typarray.
ARRAYS: Final = {
    BOOL: 1000,
    BYTEA: 1001,
    INT2: 1005,
    INT4: 1007,
    TEXT: 1009,
    INT8: 1016,
    FLOAT4: 1021,
    FLOAT8: 1022,
    TIMESTAMP: 1115,
    DATE: 1182,
    TIME: 1183,
    TIMESTAMPTZ: 1185,
    INTERVAL: 1187,
    NUMERIC: 1231,
    UUID: 2951,
    JSON: 199,
}

Convert = Callable[[object], object]


@dataclass(frozen=True)
class PgType:
    """A column's PostgreSQL type: its OID, its name (as ``format_type`` and
    ``information_schema`` spell it: what SQLAlchemy's reflection reads)
    and how a JSON-ready value of it becomes the value the wire encodes."""

    oid: int
    name: str
    convert: Convert


def _same(value: object) -> object:
    return value


def _decimal(value: object) -> object:
    return decimal.Decimal(str(value))


def _float(value: object) -> object:
    # Non-finite floats arrive as strings ("nan", "inf", "-inf").
    return float(value) if isinstance(value, str) else value


def _bytes(value: object) -> object:
    text = str(value)
    if text.startswith("base64:"):
        return base64.b64decode(text[len("base64:") :])
    return text.encode("utf-8")


def _timestamp(value: object) -> object:
    return dt.datetime.fromisoformat(str(value))


class _TimestampTz(dt.datetime):
    """An instant whose text is PostgreSQL's (``2026-11-30 10:00:00+00``, where Python
    writes ``+00:00``): what pgJDBC's getString and psql show, text or binary alike."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        text = super().isoformat(sep, timespec)
        return text[:-3] if text.endswith(":00") and text[-6] in "+-" else text


def _timestamptz(value: object) -> object:
    moment = dt.datetime.fromisoformat(str(value)).astimezone(dt.UTC)
    return _TimestampTz.combine(moment.date(), moment.timetz())


def _date(value: object) -> object:
    return dt.date.fromisoformat(str(value))


def _time(value: object) -> object:
    return dt.time.fromisoformat(str(value))


_TIMEDELTA: Final = re.compile(
    r"(?:(?P<days>-?\d+) days?, )?(?P<hours>\d+):(?P<minutes>\d\d):(?P<seconds>\d\d(?:\.\d+)?)"
)


def _interval(value: object) -> object:
    # str(datetime.timedelta): "[-]D day[s], H:MM:SS[.ffffff]".
    match = _TIMEDELTA.fullmatch(str(value))
    if match is None:
        return str(value)
    return dt.timedelta(
        days=int(match["days"] or 0),
        hours=int(match["hours"]),
        minutes=int(match["minutes"]),
        seconds=float(match["seconds"]),
    )


def _uuid(value: object) -> object:
    return uuid.UUID(str(value))


def _text(value: object) -> object:
    return value if isinstance(value, str) else str(value)


_SCALARS: Final[dict[str, PgType]] = {
    "BOOLEAN": PgType(BOOL, "boolean", _same),
    "TINYINT": PgType(INT2, "smallint", _same),
    "SMALLINT": PgType(INT2, "smallint", _same),
    "UTINYINT": PgType(INT2, "smallint", _same),
    "USMALLINT": PgType(INT4, "integer", _same),
    "INTEGER": PgType(INT4, "integer", _same),
    "UINTEGER": PgType(INT8, "bigint", _same),
    "BIGINT": PgType(INT8, "bigint", _same),
    "UBIGINT": PgType(NUMERIC, "numeric", _decimal),
    "HUGEINT": PgType(NUMERIC, "numeric", _decimal),
    "UHUGEINT": PgType(NUMERIC, "numeric", _decimal),
    "VARINT": PgType(NUMERIC, "numeric", _decimal),
    "BIGNUM": PgType(NUMERIC, "numeric", _decimal),
    "FLOAT": PgType(FLOAT4, "real", _float),
    "DOUBLE": PgType(FLOAT8, "double precision", _float),
    "VARCHAR": PgType(TEXT, "text", _text),
    "BLOB": PgType(BYTEA, "bytea", _bytes),
    "DATE": PgType(DATE, "date", _date),
    "TIME": PgType(TIME, "time without time zone", _time),
    "TIMESTAMP": PgType(TIMESTAMP, "timestamp without time zone", _timestamp),
    "TIMESTAMP_S": PgType(TIMESTAMP, "timestamp without time zone", _timestamp),
    "TIMESTAMP_MS": PgType(TIMESTAMP, "timestamp without time zone", _timestamp),
    "TIMESTAMP_NS": PgType(TIMESTAMP, "timestamp without time zone", _timestamp),
    "TIMESTAMP WITH TIME ZONE": PgType(TIMESTAMPTZ, "timestamp with time zone", _timestamptz),
    "INTERVAL": PgType(INTERVAL, "interval", _interval),
    "UUID": PgType(UUID, "uuid", _uuid),
    "JSON": PgType(JSON, "json", _text),
}
_JSON_VALUE: Final = PgType(JSON, "json", _same)
_TEXT_VALUE: Final = PgType(TEXT, "text", _text)


def pg_type(duckdb_type: str) -> PgType:
    """The PostgreSQL type a column of ``duckdb_type`` (DuckDB's spelling:
    ``DECIMAL(18,4)``, ``VARCHAR[]``, ``STRUCT(a INTEGER)``) is sent as."""
    kind = duckdb_type.strip()
    if kind.endswith("[]"):
        element = pg_type(kind[:-2])
        array = ARRAYS.get(element.oid)
        if array is None:  # an array of structs, of arrays: a JSON document
            return _JSON_VALUE
        convert = element.convert
        return PgType(array, f"{element.name}[]", lambda v: _each(v, convert))
    if kind.startswith("DECIMAL"):
        return PgType(NUMERIC, "numeric", _decimal)
    if kind.startswith(("STRUCT", "MAP", "UNION")) or re.fullmatch(r".+\[\d+\]", kind):
        return _JSON_VALUE
    return _SCALARS.get(kind.upper(), _TEXT_VALUE)


def _each(value: object, convert: Convert) -> object:
    if not isinstance(value, list):
        return value
    return [None if v is None else convert(v) for v in value]


def wire_rows(
    types: Sequence[PgType], rows: Sequence[Sequence[object]]
) -> list[tuple[object, ...]]:
    """``rows`` of JSON-ready values as the values their columns' ``types`` encode."""
    converts = [t.convert for t in types]
    return [
        tuple(None if v is None else c(v) for c, v in zip(converts, row, strict=True))
        for row in rows
    ]
