"""GET /api/v1/ctr: the merged CTR view, rolled up, filtered, grouped, ordered; JSON or CSV.

The route parses the parameters; :mod:`api.ctr_answers` answers them, :mod:`api.rendering`
renders the answer."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Final

from fastapi import APIRouter, Header, Query, Request, Response

from api.ctr_answers import CtrParameters, ctr_answer
from api.deps import AccessDep, CacheDep, ClientDep, ServingDep, SettingsDep
from api.errors import ParameterError
from api.formats import FormatParam, negotiate, openapi_responses
from api.models import CtrResponse, ErrorResponse
from api.times import as_utc
from api.versions import wanted_versions
from views.columns import DIMENSIONS

router = APIRouter(prefix="/api/v1", tags=["ctr"])

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
        400: {
            "model": ErrorResponse,
            "description": "a bad parameter, or over the byte or memory limit",
        },
        401: {"model": ErrorResponse},
        429: {
            "model": ErrorResponse,
            "description": "too many CTR queries at once, or this key's share of them running "
            "(API_CTR_WORKERS_PER_KEY; with API_LIMITS_URL, across the API's replicas)",
        },
        503: {
            "model": ErrorResponse,
            "description": "stopped at the time limit (API_CTR_TIMEOUT_S), or the limits store "
            "the replicas share (API_LIMITS_URL) did not answer: retry after Retry-After seconds",
        },
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
    parameters = CtrParameters(
        start=as_utc(start, "start") if start is not None else None,
        end=as_utc(end, "end") if end is not None else None,
        as_of=moment,
        granularity=granularity,
        group_by=group_by,
        order_by=order_by,
        filters={name: v for name, v in values.items() if v},
        limit=limit,
        version=version,
        reach=reach,
        output=output,
        seen=wanted_versions(request),
    )
    answer = await ctr_answer(
        request,
        parameters,
        serving=serving,
        settings=settings,
        cache=cache,
        client=client,
        access=access,
    )
    return answer.response()
