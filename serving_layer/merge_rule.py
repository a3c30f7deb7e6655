"""The serving rule as SQL, written once: per minute bucket, covered by a batch run → the batch
rows plus the bucket's arrivals no run has counted yet, else the speed rows. Read by the CTR
query's SQL (:mod:`serving_layer.ctr_sql`), the snapshot reader's merged relation and the SQL
sandbox's ``ctr`` views.

Only identifiers from fixed allow-lists (the dimensions, the measures, the registered table
names) are written into the SQL text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from views.columns import DIMENSIONS, SKETCHES
from views.columns import MEASURES as COUNTS


def merged_sql(
    *,
    batch: str,
    speed: str,
    covered: str,
    stale: str | None = None,
    dimensions: Sequence[str] = DIMENSIONS,
    sketched: bool = False,
) -> str:
    """The merge rule at minute grain, as one SELECT (also the sandbox's ``ctr`` view).

    Per minute bucket: covered by a batch run → the batch rows plus the late arrivals no run
    has counted yet (``stale``), else the speed rows. Columns: bucket_start, ``dimensions``,
    impressions, clicks, raw_clicks, orphan_clicks, repeat_clicks, stale_events, source
    ('batch' | 'late' | 'speed'), run_id. The sides are those of
    :func:`serving_layer.ctr_sql.ctr_sql`.
    ``covered`` must hold disjoint intervals, so the as-of join finds the one that could hold a
    bucket. ``dimensions`` come from :data:`views.DIMENSIONS`, never from a request.
    ``sketched``: the rows' :data:`views.columns.SKETCHES` too, after the counts (the sides
    must have them; late arrivals have none: null), to union (``sketch_union``).
    """
    unknown = set(dimensions) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"'dimensions' must be among {DIMENSIONS}, got {sorted(unknown)}")
    columns = ", ".join(["t.bucket_start", *(f"t.{d}" for d in dimensions)])
    extra = None
    if sketched:
        measures = ", ".join(f"t.{m}" for m in COUNTS)
        sketch = ", ".join(f"t.{s}" for s in SKETCHES)
        counted = f"{measures}, 0::BIGINT AS stale_events, {sketch}"
        unsketched = ", ".join(f"NULL::BLOB AS {s}" for s in SKETCHES)
        extra = {
            "batch": counted,
            "speed": counted,
            "late": f"{measures}, t.stale_events, {unsketched}",
        }
    return merge_rule(
        Sides(batch, speed, covered, stale), columns=columns, source=True, extra=extra
    )


@dataclass(frozen=True)
class Sides:
    """The relations the merge rule reads (trusted names)."""

    batch: str
    speed: str
    covered: str
    stale: str | None = None


def merge_rule(
    sides: Sides,
    *,
    columns: str,
    where: Sequence[str] = (),
    predicate: str | None = None,
    source: bool = False,
    extra: Mapping[str, str] | None = None,
) -> str:
    """The serving rule, written once: per minute bucket, covered by a batch run → the batch
    rows plus the bucket's arrivals no run has counted yet, else the speed rows.

    Of ``sides``, ``covered`` holds the disjoint covered intervals; the as-of join finds the one
    interval that could hold a bucket. ``stale`` holds the uncounted arrivals (only covered
    buckets have any).
    ``predicate``, when given, is the same coverage as a range predicate on ``t.bucket_start``
    (:func:`lake.coverage.in_intervals_sql`), which DuckDB pushes into the Parquet scan instead
    of joining. ``where`` narrows every side; ``source`` adds a column saying which side a row
    came from. Every row has the five counts of :data:`views.columns.MEASURES` and says how
    many of its events are uncounted arrivals (``stale_events``). ``extra`` replaces those
    columns by others, per side (``batch``, ``speed``, ``late``: select lists over ``t``; a side
    not named keeps them).
    """
    batch, speed, covered, stale = sides.batch, sides.speed, sides.covered, sides.stale
    narrow = "".join(f" AND {condition}" for condition in where)
    from_batch = ", 'batch' AS source" if source else ""
    from_speed = ", 'speed' AS source" if source else ""
    measures = ", ".join(f"t.{m}" for m in COUNTS)
    counted = f"{measures}, 0::BIGINT AS stale_events"
    counted_late = f"{measures}, t.stale_events"
    extra = extra or {}
    counted_batch = extra.get("batch", counted)
    counted_speed = extra.get("speed", counted)
    counted_late = extra.get("late", counted_late)
    late = ""
    if stale is not None:
        from_late = ", 'late' AS source" if source else ""
        late = f"""
            UNION ALL
            SELECT {columns}, {counted_late}{from_late},
                   NULL::VARCHAR AS run_id
            FROM {stale} t WHERE true{narrow}
        """
    if predicate is not None:
        return f"""
            SELECT {columns}, {counted_batch}{from_batch}, t.run_id
            FROM {batch} t WHERE {predicate}{narrow}
            UNION ALL
            SELECT {columns}, {counted_speed}{from_speed}, NULL::VARCHAR AS run_id
            FROM {speed} t WHERE NOT {predicate}{narrow}{late}
        """
    return f"""
        SELECT {columns}, {counted_batch}{from_batch}, t.run_id
        FROM {batch} t ASOF JOIN {covered} c ON t.bucket_start >= c.interval_start
        WHERE t.bucket_start < c.interval_end{narrow}
        UNION ALL
        SELECT {columns}, {counted_speed}{from_speed}, NULL::VARCHAR AS run_id
        FROM {speed} t ASOF LEFT JOIN {covered} c ON t.bucket_start >= c.interval_start
        WHERE (c.interval_end IS NULL OR t.bucket_start >= c.interval_end){narrow}{late}
    """
