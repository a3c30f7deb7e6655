"""GET /api/v1/ctr: the merged CTR view, rolled up, filtered, grouped, ordered; JSON or CSV."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Hashable
from typing import Annotated, Final

import orjson
from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import AccessDep, CacheDep, ClientDep, ServingDep, SettingsDep
from api.errors import ParameterError
from api.formats import CSV_MEDIA_TYPE, Format, FormatParam, negotiate, openapi_responses
from api.models import CtrResponse, ErrorResponse
from api.query_gate import GateBusyError, QueryGate
from api.rendering import Rendered, freshness_json
from api.response_cache import ResponseCache
from api.times import as_utc
from serving_layer.csv_rows import csv_cell, csv_text
from serving_layer.query import CtrQuery, QueryError, QueryLimits
from serving_layer.reach import Reach
from serving_layer.service import CtrResult
from serving_layer.snapshots import AsOfError, LakeSnapshot
from views.columns import DIMENSIONS
from views.definitions import UnknownVersionError, definition

router = APIRouter(prefix="/api/v1", tags=["ctr"])

DEFAULT_LIMIT: Final = 10_000
_COMMON: Final = frozenset(
    {
        "start",
        "end",
        "granularity",
        "group_by",
        "order_by",
        "limit",
        "as_of",
        "version",
        "format",
        "reach",
    }
)
Filter = Annotated[list[str] | None, Query(description="keep rows with this value (repeatable)")]
# Who each row reached (serving_layer.reach), after its counts and provenance, with reach=true.
REACH_COLUMNS: Final = (
    "reach",
    "reach_low",
    "reach_high",
    "reach_exact",
    "frequency",
    "clicking_users",
)
MEASURE_COLUMNS: Final = (
    "impressions",
    "clicks",
    "raw_clicks",
    "orphan_clicks",
    "repeat_clicks",
    "ctr",
    "ctr_ci_low",
    "ctr_ci_high",
    "source",
    "covered_fraction",
    "stale_events",
    "run_ids",
)
CSV_HEADERS: Final = {
    "Ctr-Truncated": "true when more rows matched than 'limit'",
    "Ctr-View": "the view and version that answered, e.g. ctr@1",
    "Ctr-Latest-Covered-Bucket": "start of the last minute the batch layer made exact",
    "Ctr-Latest-Speed-Bucket": "newest minute in speed/ctr",
}
_CSV_EXAMPLE: Final = (
    "bucket_start,country,impressions,clicks,raw_clicks,orphan_clicks,repeat_clicks,ctr,"
    "ctr_ci_low,ctr_ci_high,source,covered_fraction,stale_events,run_ids,reach,reach_low,"
    "reach_high,reach_exact,frequency,clicking_users\r\n"
    "2026-11-22T10:00:00Z,US,1200,31,31,,,0.025833333333333333,0.01825,0.03647,mixed,0.5,0,"
    "ctr-20261122T0900-20261122T1030-v42,1067,1033,1102,false,1.1246485473289597,30\r\n"
)


@router.get(
    "/ctr",
    response_model=CtrResponse,
    responses={
        **openapi_responses(_CSV_EXAMPLE, CSV_HEADERS),
        400: {"model": ErrorResponse, "description": "a bad parameter, or over a limit"},
        401: {"model": ErrorResponse},
        429: {"model": ErrorResponse, "description": "too many CTR queries at once"},
    },
    summary="CTR per time bucket: batch where covered, speed elsewhere",
)
async def get_ctr(
    request: Request,
    serving: ServingDep,
    settings: SettingsDep,
    cache: CacheDep,
    client: ClientDep,
    access: AccessDep,
    start: Annotated[
        dt.datetime | None,
        Query(
            description="ISO-8601, from 1970-01-01 to 9999-01-01; default: end - 24 h; "
            "no offset = UTC"
        ),
    ] = None,
    end: Annotated[
        dt.datetime | None, Query(description="ISO-8601, exclusive; default: now")
    ] = None,
    granularity: Annotated[
        str,
        Query(
            description="minute | hour | day | all: one bucket spanning [start, end) per group "
            "(a total over the range; bucket_start = start)"
        ),
    ] = "hour",
    group_by: Annotated[
        str | None, Query(description=f"comma-separated subset of {', '.join(DIMENSIONS)}")
    ] = None,
    order_by: Annotated[
        str | None,
        Query(
            description="comma-separated: bucket_start, impressions, clicks, raw_clicks, "
            "orphan_clicks, repeat_clicks, ctr or a grouped dimension; '-' prefix for "
            "descending (e.g. -clicks; null counts sort last). Default: bucket_start"
        ),
    ] = None,
    limit: Annotated[
        int | None,
        Query(ge=1, description="rows at most; default 10,000, at most API_MAX_ROWS"),
    ] = None,
    campaign_id: Filter = None,
    ad_id: Filter = None,
    site_id: Filter = None,
    country: Filter = None,
    device_type: Filter = None,
    as_of: Annotated[
        dt.datetime | None,
        Query(
            description="ISO-8601, no offset = UTC: answer as of this moment, from the Delta "
            "versions current then (the answer the API gave then, but for the speed job's "
            "status in freshness: null, it is not versioned; end defaults to it). 400 if it is "
            "in the future, before the lake's first commit, or the versions of then were "
            "removed (retention)"
        ),
    ] = None,
    version: Annotated[
        int | None,
        Query(
            ge=1,
            description="the view version to answer from (see GET /api/v1/views versions); "
            "default: the published one. An unpublished version can be queried as a preview",
        ),
    ] = None,
    reach: Annotated[
        bool,
        Query(
            description="also reach, frequency and clicking_users per row (distinct users: "
            "exact where the batch layer covers the row, else a sketch estimate with bounds). "
            "A distinct count over the range's users: costs far more than the counts on long "
            "ranges, so asked for"
        ),
    ] = False,
    format: FormatParam = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    unknown = sorted(set(request.query_params) - _COMMON - set(DIMENSIONS))
    if unknown:
        raise ParameterError(
            unknown[0],
            f"unknown parameter; allowed: {', '.join(sorted(_COMMON))}, {', '.join(DIMENSIONS)}",
        )
    output = negotiate(format, accept)
    values = dict(zip(DIMENSIONS, (campaign_id, ad_id, site_id, country, device_type), strict=True))
    moment = as_utc(as_of, "as_of") if as_of is not None else None
    try:
        query = CtrQuery.create(
            start=as_utc(start, "start") if start is not None else None,
            end=as_utc(end, "end") if end is not None else moment or dt.datetime.now(dt.UTC),
            granularity=granularity,
            group_by=_split(group_by),
            filters={name: v for name, v in values.items() if v},
            order_by=_split(order_by),
            limit=min(DEFAULT_LIMIT, settings.max_rows) if limit is None else limit,
            # An advertiser's key reads its campaigns' rows only: the filters narrow them,
            # totals and top-N are computed over them.
            scope=access.scope,
            reach=reach,
        )
        limits = QueryLimits(dt.timedelta(days=settings.max_range_days), settings.max_rows)
        query = limits.check(query)
    except QueryError as exc:
        if exc.parameter == "end" and end is None and moment is not None:
            # The end was as_of's: the moment is what the client can change.
            raise ParameterError("as_of", f"{exc.message} (the range ends at as_of)") from None
        raise ParameterError(exc.parameter, exc.message) from None
    if version is not None:
        try:
            definition("ctr", version)
        except UnknownVersionError as exc:
            raise ParameterError("version", str(exc)) from None
    # On the event loop while nothing blocks (a cached answer of a current snapshot, the usual
    # case); reading Delta logs and querying DuckDB go to threads of their own, a few at once
    # (the gate: a queue, then 429), so no client's heavy queries hold every thread.
    if moment is None:
        cached = serving.snapshots.cached()
        snapshot = cached if cached is not None else await run_in_threadpool(serving.snapshot)
        key: tuple[object, ...] = ("ctr", query, version, output)
    else:
        try:
            snapshot = await run_in_threadpool(serving.snapshots.at, moment)
        except AsOfError as exc:
            raise ParameterError("as_of", str(exc)) from None
        # Keyed by its snapshot too: never another snapshot's answer, not even a recent one.
        key = ("ctr", query, version, output, snapshot.key)
    max_bytes = int(settings.ctr_max_bytes)

    def compute_at(snap: LakeSnapshot) -> Rendered:
        answer = render(serving.ctr(query, snap, version), output)
        if len(answer.body) > max_bytes:
            raise ParameterError(
                "limit",
                f"the answer is {len(answer.body):,} bytes, over API_CTR_MAX_BYTES "
                f"({max_bytes:,}): ask for fewer rows (limit), a shorter range, a coarser "
                "granularity or fewer group_by dimensions",
            )
        return answer

    def compute() -> Rendered:
        return compute_at(snapshot)

    # The latest snapshot's answers are recomputed ahead of the next request while they are
    # read (see ResponseCache.refresh_ahead); an as-of answer never changes.
    ahead = compute_at if moment is None else None
    answer = cache.peek(key, snapshot.key, compute, ahead=ahead)
    if answer is None:
        answer = await _computed(request, client, cache, key, snapshot.key, compute)
    return answer.response()


async def _computed(
    request: Request,
    client: str,
    cache: ResponseCache[Rendered],
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


def reach_values(reach: Reach) -> tuple[object, ...]:
    """A row's :data:`REACH_COLUMNS`."""
    return (
        reach.reach,
        reach.low,
        reach.high,
        reach.exact,
        reach.frequency,
        reach.clicking_users,
    )


def render(result: CtrResult, output: Format = "json") -> Rendered:
    """The answer in ``output``'s format."""
    return render_csv(result) if output == "csv" else Rendered(render_json(result))


def render_csv(result: CtrResult) -> Rendered:
    """A header row (bucket_start, the grouped dimensions, the measures and provenance) and a
    line per row; run_ids space-separated; the answer's other fields as headers."""
    groups = result.query.group_by
    reached = result.query.reach
    lines = (
        [
            row.bucket_start,
            *(row.dimensions[d] for d in groups),
            row.impressions,
            row.clicks,
            row.raw_clicks,
            row.orphan_clicks,
            row.repeat_clicks,
            row.ctr,
            row.ctr_ci_low,
            row.ctr_ci_high,
            row.source,
            row.covered_fraction,
            row.stale_events,
            " ".join(row.run_ids),
            *(reach_values(row.reach) if reached else ()),
        ]
        for row in result.rows
    )
    freshness = result.freshness
    headers = {
        "Ctr-Truncated": "true" if result.truncated else "false",
        "Ctr-View": f"{result.view.view}@{result.view.version}",
        "Ctr-Latest-Covered-Bucket": str(csv_cell(freshness.latest_covered_bucket)),
        "Ctr-Latest-Speed-Bucket": str(csv_cell(freshness.latest_speed_bucket)),
    }
    return Rendered(
        csv_text(
            ["bucket_start", *groups, *MEASURE_COLUMNS, *(REACH_COLUMNS if reached else ())],
            lines,
        ).encode(),
        CSV_MEDIA_TYPE,
        tuple(headers.items()),
    )


def render_json(result: CtrResult) -> bytes:
    """The response body; rows built as plain dicts (validating them again costs more than
    the query for large answers)."""
    query = result.query
    rows = []
    for row in result.rows:
        item: dict[str, object] = {"bucket_start": row.bucket_start}
        item.update(row.dimensions)
        item.update(
            impressions=row.impressions,
            clicks=row.clicks,
            raw_clicks=row.raw_clicks,
            orphan_clicks=row.orphan_clicks,
            repeat_clicks=row.repeat_clicks,
            ctr=row.ctr,
            ctr_ci_low=row.ctr_ci_low,
            ctr_ci_high=row.ctr_ci_high,
            source=row.source,
            covered_fraction=row.covered_fraction,
            stale_events=row.stale_events,
            run_ids=list(row.run_ids),
        )
        if query.reach:
            item.update(zip(REACH_COLUMNS, reach_values(row.reach), strict=True))
        rows.append(item)
    return orjson.dumps(
        {
            "view": {"name": result.view.view, "version": result.view.version},
            "rows": rows,
            "truncated": result.truncated,
            "query": {
                "start": query.start,
                "end": query.end,
                "granularity": query.granularity,
                "group_by": list(query.group_by),
                "filters": {name: list(v) for name, v in query.filters},
                "order_by": [str(k) for k in query.order_by],
                "limit": query.limit,
            },
            "freshness": freshness_json(result.freshness, scoped=query.scope is not None),
        },
        option=orjson.OPT_UTC_Z,
    )


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()] if value else []
