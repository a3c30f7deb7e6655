"""The serving benchmark's mix of distinct dashboard queries (issue 20).

A dashboard with filters rarely sends the same query twice: each user picks a range (a preset
or a brushed span), filters on a few dimension values, splits by a dimension or two, or asks for
a top-N table. :func:`dashboard_mix` draws such queries, seeded, all distinct;
:func:`request_path` is a query as the dashboard sends it to ``GET /api/v1/ctr``, and
:func:`ctr_statement` its SQL as the serving layer builds it, so the API and the in-process
floor run the same mix. :func:`wrk_script` has wrk walk the mix.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlencode

from lake.catalog import batch_table
from serving_layer.query import (
    GRANULARITIES,
    MAX_PREDICATE_INTERVALS,
    STEP,
    CtrQuery,
    ctr_sql,
)
from serving_layer.service import ServingLayer
from serving_layer.tables import LakeSnapshot
from views.columns import DIMENSIONS

MIX_QUERIES: Final = 1000
MIX_SEED: Final = 20
# Range presets a dashboard offers (minutes); the other half of the ranges are brushed spans.
PRESETS: Final = (15, 60, 180, 360, 720, 1440)
SHORTEST, LONGEST = 15, 24 * 60
# A chart draws at most this many points: a finer or wider split than that is coarsened.
MAX_POINTS: Final = 2000
TOP_N: Final = 10
DEFAULT_LIMIT: Final = 10_000  # the API's, when a request names none
# How often each granularity is picked among those that suit a range (``all`` once the
# serving layer has it).
_GRANULARITY_WEIGHT: Final = {"minute": 3, "hour": 3, "day": 1, "all": 2}


def dashboard_mix(
    n: int,
    *,
    values: Mapping[str, Sequence[str]],
    start: dt.datetime,
    end: dt.datetime,
    seed: int = MIX_SEED,
) -> list[CtrQuery]:
    """``n`` distinct CTR queries over [start, end) as a dashboard with filters sends them.

    ``values`` are the lake's dimension combinations, one sequence per dimension, aligned (row
    ``i`` of each is one combination): filters take their values from them, so two filtered
    dimensions still meet. Each query has a minute-aligned range of 15 min to 24 h within
    [start, end) (a preset length or a random one), a granularity that suits it (minute up to
    6 h, hour from 1 h, day from 12 h, ``all`` when the serving layer has it), filters on 0-2
    dimensions with 1-3 values each, a split by 0-2 dimensions, and for a quarter of the split
    queries a top-10 by clicks (``order_by=-clicks&limit=10``). A split that would draw more
    than :data:`MAX_POINTS` points is coarsened, as a chart would.
    """
    if n < 1:
        raise ValueError(f"'n' must be at least 1, got {n}")
    if end - start < dt.timedelta(minutes=SHORTEST):
        raise ValueError(f"'end' must be at least {SHORTEST} min after 'start'")
    missing = set(DIMENSIONS) - set(values)
    if missing:
        raise ValueError(f"'values' must hold every dimension, missing {sorted(missing)}")
    rows = list(zip(*(values[d] for d in DIMENSIONS), strict=True))
    rng = random.Random(seed)
    mix: dict[CtrQuery, None] = {}
    for _ in range(n * 100):
        mix[_draw(rng, rows, start, end)] = None
        if len(mix) == n:
            return list(mix)
    raise ValueError(f"could not draw {n} distinct queries over {start} - {end}")


def request_path(query: CtrQuery) -> str:
    """``query`` as a ``GET /api/v1/ctr`` path with its query string."""
    params: list[tuple[str, str]] = [
        ("start", _iso(query.start)),
        ("end", _iso(query.end)),
        ("granularity", query.granularity),
    ]
    if query.group_by:
        params.append(("group_by", ",".join(query.group_by)))
    params += [(name, value) for name, chosen in query.filters for value in chosen]
    if query.order_by:
        params.append(("order_by", ",".join(str(k) for k in query.order_by)))
    if query.limit != DEFAULT_LIMIT:
        params.append(("limit", str(query.limit)))
    return f"/api/v1/ctr?{urlencode(params)}"


def ctr_statement(
    serving: ServingLayer, query: CtrQuery, snapshot: LakeSnapshot
) -> tuple[str, dict[str, object]]:
    """The SQL and parameters :meth:`ServingLayer.ctr` runs for ``query`` over ``snapshot``
    (the published view): the same relations, stale arrivals and coverage predicate."""
    view = serving.definition(snapshot)
    within = serving.coverage(snapshot, view).within(query.start, query.end)
    return ctr_sql(
        query,
        batch=serving.relation_name(snapshot[batch_table(view).name]),
        speed=serving._filtered(snapshot["speed/ctr"], view),
        covered=serving._covered_relation(snapshot["batch/coverage"], view.key),
        stale=serving._stale_relation(snapshot, view),
        intervals=within if len(within) <= MAX_PREDICATE_INTERVALS else None,
    )


def wrk_script(paths: Sequence[str], threads: int) -> str:
    """A wrk Lua script sending ``paths`` in turn: each of wrk's ``threads`` walks the list
    from its own offset (an equal share apart), and its connections take the next path each,
    so concurrent requests differ."""
    if not paths:
        raise ValueError("'paths' must not be empty")
    listed = ",\n".join(f'  "{p}"' for p in paths)  # urlencoded: no quote or backslash
    return f"""-- generated by bench/serving_mix.py
local paths = {{
{listed}
}}
local threads = {threads}
local created = 0
local next_index = 0

function setup(thread)
  thread:set("thread_id", created)
  created = created + 1
end

function init(args)
  next_index = math.floor(thread_id * #paths / threads)
end

function request()
  next_index = next_index % #paths + 1
  return wrk.format("GET", paths[next_index])
end
"""


def _draw(
    rng: random.Random,
    rows: Sequence[tuple[str, ...]],
    start: dt.datetime,
    end: dt.datetime,
) -> CtrQuery:
    """One dashboard query (see :func:`dashboard_mix`)."""
    span = int((end - start) / dt.timedelta(minutes=1))
    longest = min(LONGEST, span)
    if rng.random() < 0.5:
        minutes = rng.choice([p for p in PRESETS if p <= longest] or [longest])
    else:  # a brushed span, as likely a few minutes as a few hours
        minutes = round(math.exp(rng.uniform(math.log(SHORTEST), math.log(longest))))
    first = start + dt.timedelta(minutes=rng.randint(0, span - minutes))
    last = first + dt.timedelta(minutes=minutes)
    filters = _filters(rng, rows)
    matching = [r for r in rows if all(r[DIMENSIONS.index(d)] in v for d, v in filters.items())]
    # Split by dimensions the filters leave more than one value of.
    splittable = [d for d in DIMENSIONS if len(filters.get(d, ())) != 1]
    group_by = rng.sample(splittable, min(rng.choices((0, 1, 2), (35, 45, 20))[0], 2))
    top = bool(group_by) and rng.random() < 0.25
    suited = [g for g in GRANULARITIES if _suits(g, minutes)]
    granularity = rng.choices(suited, [_GRANULARITY_WEIGHT[g] for g in suited])[0]
    if top and "all" in suited and rng.random() < 0.7:
        granularity = "all"  # a top-N table mostly ranks totals over the range
    groups = len({tuple(r[DIMENSIONS.index(d)] for d in group_by) for r in matching})
    coarser = GRANULARITIES[GRANULARITIES.index(granularity) + 1 :]
    while not top and _points(granularity, minutes, groups) > MAX_POINTS:
        if coarser:
            granularity, coarser = coarser[0], coarser[1:]
        else:  # the coarsest bucket still draws too much: split less
            group_by = group_by[:-1]
            groups = len({tuple(r[DIMENSIONS.index(d)] for d in group_by) for r in matching})
    return CtrQuery.create(
        start=first,
        end=last,
        granularity=granularity,
        group_by=group_by,
        filters=filters,
        order_by=["-clicks"] if top else [],
        limit=TOP_N if top else DEFAULT_LIMIT,
    )


def _filters(rng: random.Random, rows: Sequence[tuple[str, ...]]) -> dict[str, list[str]]:
    """Filters on 0-2 dimensions with 1-3 values, taken from the same few combinations so
    that they select something."""
    dimensions = rng.sample(DIMENSIONS, rng.choices((0, 1, 2), (40, 40, 20))[0])
    picked = rng.sample(rows, rng.randint(1, 3))
    return {d: sorted({r[DIMENSIONS.index(d)] for r in picked}) for d in dimensions}


def _suits(granularity: str, minutes: int) -> bool:
    if granularity == "minute":
        return minutes <= 6 * 60
    if granularity == "hour":
        return minutes >= 60
    if granularity == "day":
        return minutes >= 12 * 60
    return True


def _points(granularity: str, minutes: int, groups: int) -> int:
    """Buckets x groups of a split (a bucket more for a range not aligned to the step)."""
    if granularity == "all":
        return groups
    buckets = math.ceil(dt.timedelta(minutes=minutes) / STEP[granularity]) + 1
    return buckets * max(groups, 1)


def _iso(value: dt.datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")
