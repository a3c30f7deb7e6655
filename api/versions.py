"""Answers that never go backwards across replicas: the ``Ctr-Versions`` header.

Every answer read over the lake names the table versions it read, in its body (``versions``)
and in the ``Ctr-Versions`` response header (``speed/ctr=1234,batch/ctr=56,...``, the tables
that exist). A client that sends back the versions it has seen (the same header, or the most
recent of each table over several answers) never gets an answer read from older ones: a replica
behind them looks at those tables' logs at once, and if it still cannot find those versions the
answer is a 503 with ``Retry-After`` (another replica read them moments ago, or the
client made them up). Two replicas at the same versions give the same answer, byte for byte.
"""

from __future__ import annotations

import re
from typing import Final

from fastapi import Request

from api.errors import ParameterError, ServerLimitError
from serving_layer.snapshots import BehindError, LakeSnapshot, SnapshotSource

HEADER: Final = "Ctr-Versions"
# Generous for the 13 served tables; a longer header is refused (it is parsed per request).
_MAX_TABLES: Final = 64
_MAX_BYTES: Final = 4096
_PAIR: Final = re.compile(r"\s*([a-z0-9_]+(?:/[a-z0-9_]+)*)\s*=\s*(\d{1,18})\s*")


def wanted_versions(request: Request) -> dict[str, int]:
    """The versions the request's ``Ctr-Versions`` header says the client has seen (empty
    without one); a 400 naming the header when it is malformed."""
    value = request.headers.get(HEADER)
    if value is None or not value.strip():
        return {}
    if len(value) > _MAX_BYTES:
        raise ParameterError(HEADER, f"the header is longer than {_MAX_BYTES} bytes")
    wanted: dict[str, int] = {}
    for pair in value.split(","):
        match = _PAIR.fullmatch(pair)
        if match is None:
            raise ParameterError(
                HEADER,
                f"expected table=version pairs separated by commas (as the {HEADER} header of "
                f"an answer), got {pair.strip()[:80]!r}",
            )
        name, version = match.group(1), int(match.group(2))
        wanted[name] = max(version, wanted.get(name, version))
        if len(wanted) > _MAX_TABLES:
            raise ParameterError(HEADER, f"more than {_MAX_TABLES} tables")
    return wanted


def header_value(snapshot: LakeSnapshot) -> str:
    """The ``Ctr-Versions`` value naming ``snapshot``'s versions (tables that exist)."""
    return ",".join(
        f"{name}={table.version}"
        for name, table in sorted(snapshot.tables.items())
        if table.version is not None
    )


def snapshot_at_least(source: SnapshotSource, wanted: dict[str, int]) -> LakeSnapshot:
    """:meth:`SnapshotSource.at_least` for a request (call it in a thread): a 503 with
    ``Retry-After: 1`` while this process cannot read the versions the client has seen."""
    try:
        return source.at_least(wanted)
    except BehindError as exc:
        raise ServerLimitError(str(exc), retry_after_s=1) from None
