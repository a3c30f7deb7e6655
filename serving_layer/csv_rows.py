"""Query results as CSV text (RFC 4180: a header row, CRLF line ends, quoting where needed):
the API's ``text/csv`` answers and ``ctr sql --format csv``.

Text that a spreadsheet would run as a formula is neutralised as OWASP recommends ("CSV
Injection"): a cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a
leading ``'``, so Excel, LibreOffice and Google Sheets show it as text. Only text is touched:
numbers (``-0.5``), times and the JSON of lists and objects come out as they are.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Final

import orjson

from serving_layer.json_values import jsonable

FORMULA_PREFIXES: Final = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A result value as a CSV cell: as :func:`serving_layer.json_values.jsonable` makes it
    (times ISO-8601 UTC, …), null empty, booleans ``true``/``false``, lists and objects as JSON
    text, text that starts like a formula behind a ``'`` (:func:`neutralised`)."""
    value = jsonable(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    if isinstance(value, str):
        return neutralised(value)
    return value


def neutralised(text: str) -> str:
    """``text``, behind a ``'`` if a spreadsheet would read it as a formula.

    >>> neutralised("=SUM(A1)"), neutralised("cmp-1"), neutralised("-2+3")
    ("'=SUM(A1)", 'cmp-1', "'-2+3")
    """
    return f"'{text}" if text.startswith(FORMULA_PREFIXES) else text


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """``columns`` as the header row, then one line per row of values (:func:`csv_cell`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([neutralised(c) for c in columns])
    writer.writerows([csv_cell(v) for v in row] for row in rows)
    return out.getvalue()
