"""Response formats of the data endpoints: JSON (the default) or CSV, chosen by a ``format``
parameter or the request's ``Accept`` header; and what the OpenAPI document says of them."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from fastapi import Query

from api.errors import NotAcceptableError
from api.models import ErrorResponse

Format = Literal["json", "csv"]
MEDIA_TYPES: Final[dict[Format, str]] = {"json": "application/json", "csv": "text/csv"}
CSV_MEDIA_TYPE: Final = "text/csv; charset=utf-8"

FormatParam = Annotated[
    Format | None,
    Query(
        description="json or csv; default: by the Accept header (text/csv → CSV), else JSON. "
        "CSV has a header row and one line per row; the answer's other fields are headers "
        "(Ctr-Truncated, …)"
    ),
]


# Media ranges of an Accept header looked at; the rest is ignored (browsers send about ten).
MAX_MEDIA_RANGES: Final = 64
# How much of a refused Accept header the 406 quotes.


def negotiate(format_: Format | None, accept: str | None) -> Format:
    """``format_`` if given; else the format the ``Accept`` header prefers (higher quality
    first, then the more specific match: ``text/csv, */*`` is CSV), JSON on a tie or without
    the header. :class:`NotAcceptableError` when the header rules out both."""
    if format_ is not None:
        return format_
    if accept is None or not accept.strip():
        return "json"
    ranges = _media_ranges(accept)
    best: tuple[float, int, int] | None = None
    chosen: Format | None = None
    for preference, (name, media_type) in enumerate(MEDIA_TYPES.items()):
        match = _match(media_type, ranges)
        if match is None or match[0] <= 0:
            continue
        rank = (match[0], match[1], -preference)
        if best is None or rank > best:
            best, chosen = rank, name
    if chosen is None:
        raise NotAcceptableError(accept, MEDIA_TYPES.values())
    return chosen


def _media_ranges(accept: str) -> list[tuple[str, float]]:
    """(media range, quality) of each element of an Accept header; a bad quality reads as 0."""
    ranges = []
    for element in accept.split(",", MAX_MEDIA_RANGES)[:MAX_MEDIA_RANGES]:
        media_range, *params = (part.strip() for part in element.split(";"))
        if not media_range:
            continue
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    quality = 0.0
        ranges.append((media_range.lower(), quality))
    return ranges


def _match(media_type: str, ranges: list[tuple[str, float]]) -> tuple[float, int] | None:
    """(quality, specificity) of the most specific range matching ``media_type``."""
    kind = media_type.split("/", maxsplit=1)[0]
    found: tuple[float, int] | None = None
    for media_range, quality in ranges:
        specificity = {media_type: 2, f"{kind}/*": 1, "*/*": 0}.get(media_range)
        if specificity is not None and (found is None or specificity > found[1]):
            found = (quality, specificity)
    return found


def openapi_responses(csv_example: str, csv_headers: dict[str, str]) -> dict[int | str, Any]:
    """The OpenAPI entries of a data endpoint's CSV answer (200) and of the 406."""
    return {
        200: {
            "content": {
                "text/csv": {"schema": {"type": "string"}, "example": csv_example},
            },
            "headers": {
                name: {"description": f"CSV answers only: {text}", "schema": {"type": "string"}}
                for name, text in csv_headers.items()
            },
        },
        406: {
            "model": ErrorResponse,
            "description": "the Accept header allows neither application/json nor text/csv",
        },
    }
