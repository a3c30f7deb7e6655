"""GET /api/v1/ctr's answer for parsed parameters: the query (validated, within the deployment's
limits), the snapshot it is answered over, and the rendered answer from the response cache or
computed once behind the CTR gate.

On the event loop while nothing blocks (a cached answer of a current snapshot, the usual case);
reading Delta logs and querying DuckDB go to threads of their own, a few at once (the gate: a
queue, then 429), so no client's heavy queries hold every thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from anyio import CapacityLimiter, to_thread
from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from access.roles import Access
from api.errors import GateBusyError, ParameterError
from api.formats import Format
from api.query_gate import QueryGate
from api.rendering import Rendered, rendered_ctr
from api.response_cache import ResponseCache
from api.settings import ApiSettings
from api.versions import snapshot_at_least
from serving_layer.query import CtrQuery, QueryError, QueryLimits
from serving_layer.service import ServingLayer
from serving_layer.snapshots import AsOfError, key_covers
from views.definitions import UnknownVersionError, definition

DEFAULT_LIMIT: Final = 10_000


@dataclass(frozen=True)
class CtrParameters:
    """The request's parameters as parsed: times in UTC, ``group_by`` and ``order_by`` as sent
    (comma-separated), the filters that have values."""

    start: dt.datetime | None
    end: dt.datetime | None
    as_of: dt.datetime | None
    granularity: str
    group_by: str | None
    order_by: str | None
    filters: Mapping[str, Sequence[str]]
    limit: int | None
    version: int | None
    reach: bool
    output: Format
    # The newest table versions the client has seen (its Ctr-Versions header; as-of queries
    # ignore them).
    seen: Mapping[str, int] = field(default_factory=dict)


async def ctr_answer(
    request: Request,
    parameters: CtrParameters,
    *,
    serving: ServingLayer,
    settings: ApiSettings,
    cache: ResponseCache[Rendered],
    client: str,
    access: Access,
) -> Rendered:
    """The rendered answer of ``parameters`` for ``access``, read from the versions the client
    has seen (``parameters.seen``: :mod:`api.versions`) or newer ones;
    :class:`ParameterError` for a bad parameter, :class:`GateBusyError` when no place frees
    up, :class:`ServerLimitError` when this process cannot read those versions yet."""
    query = ctr_query(parameters, settings, access)
    moment, version, output = parameters.as_of, parameters.version, parameters.output
    reader = serving.reader
    wanted = parameters.seen
    if moment is None:
        cached = reader.snapshots.cached()
        if cached is not None and not cached.behind(wanted):
            snapshot = cached
        elif wanted:
            snapshot = await run_in_threadpool(snapshot_at_least, reader.snapshots, dict(wanted))
        else:
            snapshot = await run_in_threadpool(reader.snapshot)
        key: tuple[object, ...] = ("ctr", query, version, output)
    else:
        try:
            snapshot = await run_in_threadpool(reader.snapshots.at, moment)
        except AsOfError as exc:
            raise ParameterError("as_of", str(exc)) from None
        # Keyed by its snapshot too: never another snapshot's answer, not even a recent one.
        key = ("ctr", query, version, output, snapshot.key)
    compute_at = functools.partial(
        rendered_ctr,
        serving=serving,
        query=query,
        version=version,
        output=output,
        max_bytes=int(settings.ctr_max_bytes),
    )
    compute = functools.partial(compute_at, snapshot)
    # The latest snapshot's answers are recomputed ahead of the next request while they are
    # read (see ResponseCache.refresh_ahead); an as-of answer never changes.
    ahead = compute_at if moment is None else None
    # An earlier snapshot's answer (served while the new one's is computed) only if it is not
    # older than what the client has seen.
    answer = cache.peek(
        key, snapshot.key, compute, ahead=ahead, accept=lambda seen: key_covers(seen, wanted)
    )
    if answer is None:
        answer = await _computed(
            request, client, cache, key=key, version=snapshot.key, compute=compute
        )
    return answer


def ctr_query(parameters: CtrParameters, settings: ApiSettings, access: Access) -> CtrQuery:
    """The query of ``parameters``, checked against the deployment's limits; a
    :class:`ParameterError` naming the parameter to change."""
    moment = parameters.as_of
    try:
        query = CtrQuery.create(
            start=parameters.start,
            end=parameters.end or moment or dt.datetime.now(dt.UTC),
            granularity=parameters.granularity,
            group_by=parameters.group_by or (),
            filters=parameters.filters,
            order_by=parameters.order_by or (),
            limit=min(DEFAULT_LIMIT, settings.max_rows)
            if parameters.limit is None
            else parameters.limit,
            # An advertiser's key reads its campaigns' rows only: the filters narrow them,
            # totals and top-N are computed over them.
            scope=access.scope,
            reach=parameters.reach,
        )
        limits = QueryLimits(dt.timedelta(days=settings.max_range_days), settings.max_rows)
        query = limits.check(query)
    except QueryError as exc:
        if exc.parameter == "end" and parameters.end is None and moment is not None:
            # The end was as_of's: the moment is what the client can change.
            raise ParameterError("as_of", f"{exc.message} (the range ends at as_of)") from None
        raise ParameterError(exc.parameter, exc.message) from None
    if parameters.version is not None:
        try:
            definition("ctr", parameters.version)
        except UnknownVersionError as exc:
            raise ParameterError("version", str(exc)) from None
    return query


async def _computed(
    request: Request,
    client: str,
    cache: ResponseCache[Rendered],
    *,
    key: Hashable,
    version: Hashable,
    compute: Callable[[], Rendered],
) -> Rendered:
    """The answer of ``key`` at ``version``, computed once however many ask at the same time:
    the first asker takes a place at the gate (a queue, then 429) and computes on a thread of
    the CTR limiter; the others wait for it on the event loop, holding no place and no thread."""
    future, owner = cache.claim(key, version)
    if owner:
        gate: QueryGate = request.app.state.ctr_gate
        limiter: CapacityLimiter = request.app.state.ctr_limiter
        try:
            async with gate.place(client):
                await to_thread.run_sync(cache.fill, key, version, compute, future, limiter=limiter)
        except GateBusyError as exc:
            cache.abandon(key, version, future, exc)
        except BaseException:
            # Went away before it computed: whoever waited for this answer may try again.
            cache.abandon(
                key, version, future, GateBusyError("the request computing this answer ended")
            )
            raise
    return await asyncio.wrap_future(future)
