"""What switching readers from one version of a view to another would change: per minute bucket
and dimensions, the merged answers of both versions over one snapshot, side by side, as a
:class:`views.comparison.Comparison` (`ctr views diff`, the ``ctr_reprocess`` DAG's review).
Nothing is replaced to compute it.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Final

from views.columns import ATTRIBUTION_MEASURES, DIMENSIONS
from views.comparison import Change, Comparison, Pair
from views.definitions import Definition

if TYPE_CHECKING:
    from serving_layer.reader import SnapshotReader
    from serving_layer.snapshots import LakeSnapshot

LARGEST: Final = 10


def diff_sql(a: str, b: str) -> str:
    """Per (bucket, dimensions) of the merged rows ``a`` and ``b`` (relations or subqueries
    with bucket_start, the dimensions and the counts of :func:`serving_layer.merge_rule.merged_sql`)
    in [$start, $end): both sides' sums (``impressions_a``, ``impressions_b``, …), 0 where a
    side has no row; orphan and repeat clicks null on a side without attribution."""
    dims = ", ".join(DIMENSIONS)
    keys = " AND ".join(f"x.{c} IS NOT DISTINCT FROM y.{c}" for c in ("bucket_start", *DIMENSIONS))
    side = (
        "SELECT bucket_start, {dims}, sum(impressions) AS impressions, sum(clicks) AS clicks, "
        "sum(raw_clicks) AS raw_clicks, sum(orphan_clicks) AS orphan_clicks, "
        "sum(repeat_clicks) AS repeat_clicks "
        "FROM ({rel}) WHERE bucket_start >= $start AND bucket_start < $end GROUP BY ALL"
    )
    picked = ", ".join(f"coalesce(x.{c}, y.{c}) AS {c}" for c in ("bucket_start", *DIMENSIONS))
    counted = ", ".join(
        f"coalesce({side}.{m}, 0)::BIGINT AS {m}_{name}"
        for m in ("impressions", "clicks", "raw_clicks")
        for side, name in (("x", "a"), ("y", "b"))
    )
    # A row missing on one side counts 0 there; a side without attribution has null counts.
    attributed = ", ".join(
        f"{side}.{m}::BIGINT AS {m}_{name}"
        for m in ATTRIBUTION_MEASURES[1:]
        for side, name in (("x", "a"), ("y", "b"))
    )
    return f"""
        SELECT {picked}, {counted}, {attributed},
               x.bucket_start IS NULL AS only_b, y.bucket_start IS NULL AS only_a
        FROM ({side.format(dims=dims, rel=a)}) x
        FULL OUTER JOIN ({side.format(dims=dims, rel=b)}) y ON {keys}
    """


def diff_versions(
    serving: SnapshotReader,
    a: Definition,
    b: Definition,
    *,
    start: dt.datetime,
    end: dt.datetime,
    snapshot: LakeSnapshot | None = None,
) -> Comparison:
    """Version ``a`` against version ``b`` of a view over [start, end), as readers would see
    them (the merge rule of each version) in one snapshot."""
    snap = snapshot or serving.snapshot()
    merged = [serving.merged_relation(snap, view) for view in (a, b)]
    sql = diff_sql(*merged)
    # A row changes when its impressions, clicks or click events do (orphan and repeat clicks
    # follow from those).
    changed = (
        "impressions_a <> impressions_b OR clicks_a <> clicks_b OR raw_clicks_a <> raw_clicks_b"
    )
    totals = ", ".join(
        f"coalesce(sum({m}_{side}), 0)"
        for m in ("impressions", "clicks", *ATTRIBUTION_MEASURES)
        for side in ("a", "b")
    )
    summary_sql = f"""
        SELECT count(*), count(*) FILTER (WHERE {changed}),
               count(*) FILTER (WHERE only_a), count(*) FILTER (WHERE only_b), {totals}
        FROM ({sql})
    """
    largest_sql = f"""
        SELECT * FROM ({sql})
        WHERE {changed}
        ORDER BY abs(impressions_b - impressions_a) + abs(clicks_b - clicks_a)
                 + abs(raw_clicks_b - raw_clicks_a) DESC,
                 bucket_start, {", ".join(DIMENSIONS)}
        LIMIT {LARGEST}
    """
    params = {"start": start, "end": end}
    with serving.cursor() as cur:
        result = cur.execute(summary_sql, params)
        row = result.fetchone()
        top = cur.execute(largest_sql, params)
        names = [d[0] for d in top.description]
        changes = [dict(zip(names, r, strict=True)) for r in top.fetchall()]
    assert row is not None
    compared, changed_rows, only_a, only_b, ia, ib, ca, cb, ra, rb, oa, ob, pa, pb = (
        int(v) for v in row
    )

    def counts(value_a: int | None, value_b: int | None) -> Pair:
        """Attribution counts, None on a side without attribution."""
        return (
            None if a.attribution is None else int(value_a or 0),
            None if b.attribution is None else int(value_b or 0),
        )

    largest = tuple(
        Change(
            bucket_start=c["bucket_start"].astimezone(dt.UTC),
            dimensions={d: c[d] for d in DIMENSIONS},
            impressions=(c["impressions_a"], c["impressions_b"]),
            clicks=(c["clicks_a"], c["clicks_b"]),
            raw_clicks=(c["raw_clicks_a"], c["raw_clicks_b"]),
            orphan_clicks=counts(c["orphan_clicks_a"], c["orphan_clicks_b"]),
            repeat_clicks=counts(c["repeat_clicks_a"], c["repeat_clicks_b"]),
        )
        for c in changes
    )
    return Comparison(
        view=a.view,
        a=f"v{a.version}",
        b=f"v{b.version}",
        start=start,
        end=end,
        rows_compared=compared,
        rows_changed=changed_rows,
        only_in_a=only_a,
        only_in_b=only_b,
        impressions=(ia, ib),
        clicks=(ca, cb),
        largest=largest,
        raw_clicks=(ra, rb),
        orphan_clicks=counts(oa, ob),
        repeat_clicks=counts(pa, pb),
    )
