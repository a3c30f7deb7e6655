"""Reach at real cardinality (issue 69): on a lake where nearly every few events make a
combination of dimensions of their own (bench.reach_lake, small), the serving layer's exact
reach equals DuckDB's ``count(DISTINCT user_id)`` over the events for every shape a dashboard
asks: from the reach cube where one dimension (or none) answers, from the hour rows or the
minute rows' lists where two do, and from the minute rows' lists when the hour rows would bring
too many bitmaps into the process.

Real Delta tables and the serving layer's DuckDB; the lake's cube rows are made by the batch
job's own Arrow tasks (batch_layer.reach_cube); the Spark job's cube is checked in
test_hour_rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from access.roles import Scope
from bench.reach_lake import build_realistic_lake
from bench.serving_lake import END
from lake.duckdb_delta import delta_duckdb
from lake.settings import LakeSettings
from serving_layer import reach_planner
from serving_layer.query import CtrQuery
from serving_layer.reader import SnapshotReader
from serving_layer.service import ServingLayer

START = END - dt.timedelta(hours=24)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def realistic(tmp_path_factory: pytest.TempPathFactory) -> tuple[LakeSettings, Path]:
    root = tmp_path_factory.mktemp("realistic")
    lake = LakeSettings(lake_root=root / "lake", checkpoint_root=root / "ck")
    build_realistic_lake(lake, root / "events", events=40_000, on_step=lambda step: None)
    return lake, root / "events"


@pytest.fixture(scope="module")
def layer(realistic: tuple[LakeSettings, Path]) -> Iterator[ServingLayer]:
    serving = ServingLayer(SnapshotReader(realistic[0], refresh_s=3600))
    yield serving
    serving.close()


def _truth(
    events: Path, query: CtrQuery, *, kind: str = "impression"
) -> dict[tuple[object, ...], int]:
    """Distinct users per (bucket start, *group values) straight from the events."""
    step_us = query.step // dt.timedelta(microseconds=1)
    bucket = "0" if query.granularity == "all" else f"epoch_us(event_time) // {step_us}"
    groups = "".join(f", {d}" for d in query.group_by)
    where = [f"event_type = '{kind}'", "event_time >= $start", "event_time < $end"]
    for name, values in query.filters:
        where.append(f"{name} IN ({', '.join(repr(v) for v in values)})")
    if query.scope is not None:
        where.append(f"campaign_id IN ({', '.join(repr(c) for c in query.scope.campaigns)})")
    rows = (
        delta_duckdb()
        .execute(
            f"""SELECT {bucket} AS b{groups}, count(DISTINCT user_id)
            FROM delta_scan('{events}') WHERE {" AND ".join(where)} GROUP BY ALL""",
            {"start": query.start, "end": query.end},
        )
        .fetchall()
    )
    return {(*tuple(r[1:-1]), r[0]): int(r[-1]) for r in rows}


def _answer(
    layer: ServingLayer, query: CtrQuery
) -> tuple[dict[tuple[object, ...], int], dict[tuple[object, ...], int]]:
    """The served reach and clicking users per (*group values, bucket index)."""
    result = layer.ctr(dataclasses.replace(query, reach=True))
    reach: dict[tuple[object, ...], int] = {}
    clicking: dict[tuple[object, ...], int] = {}
    for row in result.rows:
        assert row.reach.exact, row
        assert row.reach.reach is not None
        assert row.reach.clicking_users is not None
        index = 0 if query.granularity == "all" else int((row.bucket_start - EPOCH) / query.step)
        key = (*row.dimensions.values(), index)
        reach[key], clicking[key] = row.reach.reach, row.reach.clicking_users
    return reach, clicking


def _reached(reach: dict[tuple[object, ...], int]) -> dict[tuple[object, ...], int]:
    """``reach`` without rows of clicks only (no impression: no user reached)."""
    return {key: users for key, users in reach.items() if users}


def _plan(layer: ServingLayer, query: CtrQuery) -> reach_planner.ReachPlan:
    snap = layer.reader.snapshot()
    view = layer.reader.definition(snap)
    exact = query.whole_buckets(layer.reader.coverage(snap, view).within(query.start, query.end))
    return layer.planner.plan(query, snap, view, exact)


SHAPES = {
    "the day per hour and campaign": {"granularity": "hour", "group_by": ["campaign_id"]},
    "the day by campaign": {"granularity": "all", "group_by": ["campaign_id"]},
    "the day's total": {"granularity": "all"},
    "the day per hour by device type, mobile and tablet": {
        "granularity": "hour",
        "group_by": ["device_type"],
        "filters": {"device_type": ["mobile", "tablet"]},
    },
    "the day, one country": {"granularity": "day", "filters": {"country": ["DE"]}},
}
TWO_DIMENSIONS = {
    "the day by campaign and country": {
        "granularity": "all",
        "group_by": ["campaign_id", "country"],
    },
    "the day per hour by campaign, one country": {
        "granularity": "hour",
        "group_by": ["campaign_id"],
        "filters": {"country": ["US"]},
    },
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_one_dimension_or_none_is_counted_from_the_cube_exactly(
    layer: ServingLayer, realistic: tuple[LakeSettings, Path], name: str
) -> None:
    query = CtrQuery.create(start=START, end=END, **SHAPES[name])  # type: ignore[arg-type]
    plan = _plan(layer, query)
    assert plan.by_cube == [(START, END)]
    assert plan.by_bitmaps == []
    assert plan.used == []
    reach, clicking = _answer(layer, query)
    assert _reached(reach) == _truth(realistic[1], query)
    clicked = _truth(realistic[1], query, kind="click")
    assert clicking == {key: clicked.get(key, 0) for key in reach}


@pytest.mark.parametrize("name", list(TWO_DIMENSIONS))
def test_two_dimensions_are_counted_from_the_hour_rows_exactly(
    layer: ServingLayer, realistic: tuple[LakeSettings, Path], name: str
) -> None:
    query = CtrQuery.create(start=START, end=END, **TWO_DIMENSIONS[name])  # type: ignore[arg-type]
    plan = _plan(layer, query)
    assert plan.by_cube == []
    assert plan.by_bitmaps == [(START, END)]
    reach, _ = _answer(layer, query)
    assert _reached(reach) == _truth(realistic[1], query)


def test_past_the_bitmap_bound_the_minutes_lists_are_counted_in_duckdb(
    layer: ServingLayer, realistic: tuple[LakeSettings, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reach_planner, "MAX_BITMAP_ROWS", 10)
    query = CtrQuery.create(
        start=START, end=END, **TWO_DIMENSIONS["the day by campaign and country"]
    )  # type: ignore[arg-type]
    plan = _plan(layer, query)
    assert plan.by_bitmaps == []
    assert plan.statements.counted is not None
    reach, _ = _answer(layer, query)
    assert _reached(reach) == _truth(realistic[1], query)


def test_an_advertisers_scope_is_counted_from_its_campaigns_rows_of_the_cube(
    layer: ServingLayer, realistic: tuple[LakeSettings, Path]
) -> None:
    scope = Scope.create(["cmp-001", "cmp-004"])
    for group_by in ([], ["campaign_id"]):
        query = CtrQuery.create(
            start=START, end=END, granularity="hour", group_by=group_by, scope=scope
        )
        assert _plan(layer, query).by_cube == [(START, END)]
        reach, _ = _answer(layer, query)
        assert _reached(reach) == _truth(realistic[1], query)
    # Grouped by another dimension, the scope is a second one: not the cube's.
    query = CtrQuery.create(
        start=START, end=END, granularity="all", group_by=["country"], scope=scope
    )
    assert _plan(layer, query).by_cube == []
    reach, _ = _answer(layer, query)
    assert _reached(reach) == _truth(realistic[1], query)
