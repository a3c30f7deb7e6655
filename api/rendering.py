"""Answers as the API sends them, JSON or CSV: the CTR answer (computed and rendered for the
response cache, within its byte cap), the SQL answer, and the freshness both CTR and views
report."""

from __future__ import annotations

import string
from dataclasses import dataclass, field, replace
from typing import Final
from urllib.parse import quote

import orjson
from fastapi import Response

from api.errors import ParameterError
from api.formats import CSV_MEDIA_TYPE, Format
from api.versions import HEADER, header_value
from serving_layer.csv_rows import csv_cell, csv_text
from serving_layer.freshness import Freshness
from serving_layer.query import CtrQuery
from serving_layer.reach import Reach
from serving_layer.sandbox.database import SqlResult
from serving_layer.service import CtrResult, ServingLayer
from serving_layer.snapshots import LakeSnapshot


@dataclass(frozen=True)
class Rendered:
    """An answer's body, media type and headers, as the response cache keeps it."""

    body: bytes
    media_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())

    def __len__(self) -> int:
        """The bytes it holds (the response cache is bounded in them)."""
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers)

    def response(self) -> Response:
        return Response(self.body, media_type=self.media_type, headers=dict(self.headers))


def freshness_json(freshness: Freshness, *, scoped: bool = False) -> dict[str, object]:
    """``scoped``: for an advertiser key, without the stream's lag (a count of every
    campaign's records)."""
    return {
        "latest_covered_bucket": freshness.latest_covered_bucket,
        "latest_speed_bucket": freshness.latest_speed_bucket,
        "speed_updated_at": freshness.speed_updated_at,
        "speed_watermark": freshness.speed_watermark,
        "speed_lag_records": None if scoped else freshness.speed_lag_records,
        "versions": freshness.versions,
        "settle_minutes": int(freshness.settle.total_seconds() // 60),
        "clicks_window_minutes": int(freshness.clicks_window.total_seconds() // 60),
    }


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


def rendered_ctr(
    snapshot: LakeSnapshot,
    *,
    serving: ServingLayer,
    query: CtrQuery,
    version: int | None,
    output: Format,
    max_bytes: int,
) -> Rendered:
    """``query``'s answer over ``snapshot`` in ``output``'s format (what the response cache
    keeps); a 400 naming ``limit`` when it is over ``max_bytes``."""
    answer = render(serving.ctr(query, snapshot, version), output)
    answer = replace(answer, headers=(*answer.headers, (HEADER, header_value(snapshot))))
    if len(answer.body) > max_bytes:
        raise ParameterError(
            "limit",
            f"the answer is {len(answer.body):,} bytes, over API_CTR_MAX_BYTES "
            f"({max_bytes:,}): ask for fewer rows (limit), a shorter range, a coarser "
            "granularity or fewer group_by dimensions",
        )
    return answer


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


# Printable ASCII but the list's separator and the escape: kept as is in a header item.
_HEADER_SAFE: Final = "".join(c for c in string.punctuation + " " if c not in ",%")


def render_sql(result: SqlResult, output: Format = "json") -> Rendered:
    """A SQL answer: JSON, or CSV with the answer's other fields as headers."""
    elapsed_ms = round(result.elapsed_s * 1000, 3)
    if output == "csv":
        headers = {
            "Ctr-Truncated": "true" if result.truncated else "false",
            "Ctr-Truncated-By": result.truncated_by or "",
            "Ctr-Column-Types": ",".join(quote(t, safe=_HEADER_SAFE) for t in result.types),
            "Ctr-Elapsed-Ms": str(elapsed_ms),
        }
        text = csv_text(result.columns, result.rows)
        return Rendered(text.encode(), CSV_MEDIA_TYPE, tuple(headers.items()))
    return Rendered(
        orjson.dumps(
            {
                "columns": result.columns,
                "types": result.types,
                "rows": result.rows,
                "truncated": result.truncated,
                "truncated_by": result.truncated_by,
                "elapsed_ms": elapsed_ms,
            }
        )
    )
