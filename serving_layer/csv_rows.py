"""Query results as CSV text (RFC 4180: a header row, CRLF line ends, quoting where needed):
the API's ``text/csv`` answers and ``ctr sql --format csv``."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

import orjson

from serving_layer.json_values import jsonable


def csv_cell(value: object) -> object:
    """A result value as a CSV cell: as :func:`serving_layer.json_values.jsonable` makes it
    (times ISO-8601 UTC, …), null empty, booleans ``true``/``false``, lists and objects as JSON
    text."""
    value = jsonable(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    return value


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """``columns`` as the header row, then one line per row of values (:func:`csv_cell`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    writer.writerows([csv_cell(v) for v in row] for row in rows)
    return out.getvalue()
