"""What switching readers from one version of a view to another would change: per minute bucket
and dimensions, the merged answers of both versions over one snapshot, side by side.

The preview of `ctr views diff`, of the ``ctr_reprocess`` DAG's review step and of `ctr
backfill --preview`: nothing is replaced to compute it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from views.columns import DIMENSIONS
from views.definitions import Definition

if TYPE_CHECKING:
    from serving_layer.service import ServingLayer
    from serving_layer.tables import LakeSnapshot

LARGEST: Final = 10


@dataclass(frozen=True)
class Change:
    bucket_start: dt.datetime
    dimensions: dict[str, str]
    impressions: tuple[int, int]  # (a, b)
    clicks: tuple[int, int]


@dataclass(frozen=True)
class Diff:
    a: Definition
    b: Definition
    start: dt.datetime
    end: dt.datetime
    rows_compared: int
    rows_changed: int
    only_in_a: int
    only_in_b: int
    impressions: tuple[int, int]  # totals (a, b)
    clicks: tuple[int, int]
    largest: tuple[Change, ...]

    @property
    def changed_fraction(self) -> float:
        return self.rows_changed / self.rows_compared if self.rows_compared else 0.0


def diff_sql(a: str, b: str) -> str:
    """Per (bucket, dimensions) of the merged rows ``a`` and ``b`` (relations or subqueries
    with bucket_start, the dimensions, impressions, clicks) in [$start, $end): both sides'
    sums, 0 where a side has no row."""
    dims = ", ".join(DIMENSIONS)
    keys = " AND ".join(f"x.{c} IS NOT DISTINCT FROM y.{c}" for c in ("bucket_start", *DIMENSIONS))
    side = (
        "SELECT bucket_start, {dims}, sum(impressions) AS impressions, sum(clicks) AS clicks "
        "FROM ({rel}) WHERE bucket_start >= $start AND bucket_start < $end GROUP BY ALL"
    )
    picked = ", ".join(f"coalesce(x.{c}, y.{c}) AS {c}" for c in ("bucket_start", *DIMENSIONS))
    return f"""
        SELECT {picked},
               coalesce(x.impressions, 0)::BIGINT AS impressions_a,
               coalesce(y.impressions, 0)::BIGINT AS impressions_b,
               coalesce(x.clicks, 0)::BIGINT AS clicks_a,
               coalesce(y.clicks, 0)::BIGINT AS clicks_b,
               x.bucket_start IS NULL AS only_b, y.bucket_start IS NULL AS only_a
        FROM ({side.format(dims=dims, rel=a)}) x
        FULL OUTER JOIN ({side.format(dims=dims, rel=b)}) y ON {keys}
    """


def diff_versions(
    serving: ServingLayer,
    a: Definition,
    b: Definition,
    *,
    start: dt.datetime,
    end: dt.datetime,
    snapshot: LakeSnapshot | None = None,
) -> Diff:
    """Version ``a`` against version ``b`` of a view over [start, end), as readers would see
    them (the merge rule of each version) in one snapshot."""
    snap = snapshot or serving.snapshot()
    merged = [serving.merged_relation(snap, view) for view in (a, b)]
    sql = diff_sql(*merged)
    summary_sql = f"""
        SELECT count(*), count(*) FILTER (WHERE impressions_a <> impressions_b
                                             OR clicks_a <> clicks_b),
               count(*) FILTER (WHERE only_a), count(*) FILTER (WHERE only_b),
               coalesce(sum(impressions_a), 0), coalesce(sum(impressions_b), 0),
               coalesce(sum(clicks_a), 0), coalesce(sum(clicks_b), 0)
        FROM ({sql})
    """
    largest_sql = f"""
        SELECT * FROM ({sql})
        WHERE impressions_a <> impressions_b OR clicks_a <> clicks_b
        ORDER BY abs(impressions_b - impressions_a) + abs(clicks_b - clicks_a) DESC,
                 bucket_start, {", ".join(DIMENSIONS)}
        LIMIT {LARGEST}
    """
    params = {"start": start, "end": end}
    with serving.cursor() as cur:
        row = cur.execute(summary_sql, params).fetchone()
        top = cur.execute(largest_sql, params).fetchall()
    assert row is not None
    compared, changed, only_a, only_b, ia, ib, ca, cb = (int(v) for v in row)
    largest = tuple(
        Change(
            bucket_start=r[0].astimezone(dt.UTC),
            dimensions=dict(zip(DIMENSIONS, r[1 : 1 + len(DIMENSIONS)], strict=True)),
            impressions=(r[-6], r[-5]),
            clicks=(r[-4], r[-3]),
        )
        for r in top
    )
    return Diff(a, b, start, end, compared, changed, only_a, only_b, (ia, ib), (ca, cb), largest)


def diff_summary(result: Diff) -> dict[str, object]:
    """The diff as JSON-ready values (`ctr views diff --json`, the DAG's review log)."""
    return {
        "view": result.a.view,
        "a": result.a.version,
        "b": result.b.version,
        "rows_compared": result.rows_compared,
        "rows_changed": result.rows_changed,
        "changed_fraction": round(result.changed_fraction, 6),
        "only_in_a": result.only_in_a,
        "only_in_b": result.only_in_b,
        "impressions": {"a": result.impressions[0], "b": result.impressions[1]},
        "clicks": {"a": result.clicks[0], "b": result.clicks[1]},
        "largest": [
            {
                "bucket_start": c.bucket_start.isoformat(),
                **c.dimensions,
                "impressions": {"a": c.impressions[0], "b": c.impressions[1]},
                "clicks": {"a": c.clicks[0], "b": c.clicks[1]},
            }
            for c in result.largest
        ],
    }
