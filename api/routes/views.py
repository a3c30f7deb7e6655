"""GET /api/v1/views: what each view holds — coverage, freshness, table versions, rows."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Request, Response

from api.deps import AccessDep, ServingDep
from api.models import (
    CoveredIntervalBody,
    DriftBody,
    ErrorResponse,
    FreshnessBody,
    StaleIntervalBody,
    TableInfoBody,
    VersionInfoBody,
    ViewInfoBody,
    ViewsResponse,
)
from api.rendering import freshness_json
from api.versions import HEADER, header_value, snapshot_at_least, wanted_versions
from serving_layer.inventory import Inventory

router = APIRouter(prefix="/api/v1", tags=["views"])


@router.get(
    "/views",
    response_model=ViewsResponse,
    responses={401: {"model": ErrorResponse}},
    summary="Views: covered and stale intervals, drift, latest speed bucket, rows, versions",
)
def get_views(
    request: Request, response: Response, serving: ServingDep, access: AccessDep
) -> ViewsResponse:
    """An advertiser key gets what holds for every campaign alike (versions, covered
    intervals, the latest buckets) and its own campaigns' stale intervals; no count over other
    campaigns: no rows, runs, table sizes or drift."""
    # Not older than the versions the client has seen (its Ctr-Versions header).
    snapshot = snapshot_at_least(serving.reader.snapshots, wanted_versions(request))
    response.headers[HEADER] = header_value(snapshot)
    everything = access.sees_everything
    views = [
        ViewInfoBody(
            name=view.name,
            version=view.version,
            versions=[
                VersionInfoBody(
                    version=v.version,
                    summary=v.summary,
                    where=v.where,
                    state=v.state,  # type: ignore[arg-type]
                    covered_intervals=[
                        CoveredIntervalBody(start=i.start, end=i.end) for i in v.covered_intervals
                    ],
                    runs=v.runs if everything else None,
                    rows=v.rows if everything else None,
                )
                for v in view.versions
            ],
            covered_intervals=[
                CoveredIntervalBody(start=i.start, end=i.end) for i in view.covered_intervals
            ],
            runs=view.runs if everything else None,
            latest_covered_bucket=view.latest_covered_bucket,
            latest_speed_bucket=view.latest_speed_bucket,
            tables={
                role: TableInfoBody(table=t.table, version=t.version, rows=t.rows, files=t.files)
                for role, t in view.tables.items()
                if everything
            },
            stale_intervals=[
                StaleIntervalBody(
                    start=i.start, end=i.end, events=i.events, first_archived_at=i.first_archived_at
                )
                for i in view.stale_intervals
            ],
            drift=DriftBody(**dataclasses.asdict(view.drift)) if everything else None,
        )
        for view in Inventory(serving.reader).views(snapshot, access.scope)
    ]
    freshness = FreshnessBody.model_validate(
        freshness_json(serving.freshness(snapshot), scoped=not everything)
    )
    return ViewsResponse(views=views, freshness=freshness)
