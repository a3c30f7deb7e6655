"""Reach read where it is used: a wholly covered bucket's exact count reads no sketch, and the
other buckets' estimates count no user id exactly (serving_layer.ctr_sql.reach_sql's
``exact``), with the same answers as when both are read over the whole range; for batch rows
listing their users by number (views.columns.USER_NUMBERS) and by id (rows written before the
user dictionary), and a bucket mixing the two kinds."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Iterator

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from lake.settings import LakeSettings
from serving_layer import service
from serving_layer.query import CtrQuery
from serving_layer.reach import NOT_MEASURED
from serving_layer.reader import SnapshotReader
from serving_layer.service import CtrRow, ServingLayer
from serving_layer.snapshots import SCHEMAS
from tests.support.lake_writer import (
    T0,
    cover,
    ctr_row,
    pre_reach_schema,
    reached,
    write_batch,
    write_speed,
)

H = dt.timedelta(hours=1)
CAMPAIGNS = ("cmp-1", "cmp-2", "cmp-3")


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


# A user dictionary: user "uN" is number N + 1.
NUMBERS = {f"u{n}": n + 1 for n in range(300)}


def _rows(
    rng: random.Random, minutes: range, *, lists: bool, numbers: dict[str, int] | None = None
) -> list[dict[str, object]]:
    """A row per minute and campaign, with users drawn from 300 (so rows share users)."""
    rows = []
    for m in minutes:
        for campaign in CAMPAIGNS:
            users = [f"u{rng.randrange(300)}" for _ in range(rng.randrange(1, 12))]
            clickers = users[: rng.randrange(0, 3)]
            row = ctr_row(at(m), len(users), len(clickers), campaign=campaign)
            rows.append(reached(row, users, clickers, lists=lists, numbers=numbers))
    return rows


@pytest.fixture(params=["numbers", "ids"])
def serving(lake: LakeSettings, request: pytest.FixtureRequest) -> Iterator[ServingLayer]:
    """Hours 0 and 1 covered with batch rows (hour 2 covered to minute 150: a mixed hour),
    speed rows from minute 60 (the covered ones hidden by the merge rule) to hour 4. The batch
    rows list their users by number or (written before the dictionary) by id."""
    rng = random.Random(5)
    numbers = NUMBERS if request.param == "numbers" else None
    write_batch(lake, "run-a", _rows(rng, range(0, 150), lists=True, numbers=numbers))
    cover(lake, "run-a", at(0), at(150))
    write_speed(lake, _rows(rng, range(60, 240), lists=False))
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    yield layer
    layer.close()


QUERIES = [
    {"granularity": "hour", "end": T0 + 4 * H},
    {"granularity": "hour", "end": T0 + 4 * H, "group_by": ["campaign_id"]},
    {"granularity": "all", "end": T0 + 4 * H},
    {"granularity": "all", "end": T0 + 2 * H},
    {"granularity": "minute", "end": T0 + 3 * H, "filters": {"campaign_id": ["cmp-2"]}},
    {"granularity": "hour", "start": T0 + dt.timedelta(minutes=30), "end": T0 + 3 * H},
]


def _answer(serving: ServingLayer, params: dict[str, object]) -> list[CtrRow]:
    query = CtrQuery.create(**{"start": T0, **params}, reach=True)  # type: ignore[arg-type]
    return serving.ctr(query).rows


@pytest.mark.parametrize("params", QUERIES, ids=lambda p: str(sorted(p)))
def test_the_split_reads_give_the_answers_of_the_whole_range(
    serving: ServingLayer, params: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    split = _answer(serving, params)
    monkeypatch.setattr(service, "MAX_PREDICATE_INTERVALS", -1)  # no exact parts: the whole range
    whole = _answer(serving, params)
    assert split == whole
    assert any(r.reach.reach for r in split)
    covered = any(r.source == "batch" for r in split)
    assert any(r.reach.exact for r in split) == covered


def test_an_exact_bucket_reads_no_sketch_and_an_estimated_one_counts_no_user(
    serving: ServingLayer,
) -> None:
    query = CtrQuery.create(start=T0, end=T0 + 4 * H, granularity="hour", reach=True)
    snap = serving.reader.snapshot()
    view = serving.reader.definition(snap)
    exact = [(T0, T0 + 2 * H)]
    found = serving.reach(query, snap, view, exact=exact)
    whole = serving.reach(query, snap, view)
    hour_us = [int((T0 + n * H).timestamp() * 1_000_000) for n in range(4)]
    for us in hour_us[:2]:  # covered: the counts, no sketch
        assert found[(us,)].reach_sketches == []
        assert (found[(us,)].users, found[(us,)].clickers) == (
            whole[(us,)].users,
            whole[(us,)].clickers,
        )
        assert whole[(us,)].reach_sketches
    for us in hour_us[2:]:  # mixed and speed: the sketches, no count
        assert (found[(us,)].users, found[(us,)].clickers) == (0, 0)
        assert sorted(found[(us,)].reach_sketches or []) == sorted(
            whole[(us,)].reach_sketches or []
        )


def test_a_covered_bucket_with_rows_from_before_reach_is_not_measured(lake: LakeSettings) -> None:
    """Rows written before reach was measured, then rows with lists (the table's columns
    evolved): a covered bucket holding both is not measured, one holding the newer only is
    exact."""
    old = ctr_row(at(0), 5, 1, campaign="cmp-1")
    write_batch(lake, "run-a", [old], schema=pre_reach_schema("batch/ctr"))
    newer = [{**r, "run_id": "run-a"} for r in _rows(random.Random(6), range(1, 10), lists=True)]
    write_deltalake(
        lake.table("batch/ctr"),
        pa.Table.from_pylist(newer, schema=SCHEMAS["batch/ctr"]),
        mode="append",
        schema_mode="merge",
    )
    cover(lake, "run-a", at(0), at(60))
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        query = CtrQuery.create(start=at(0), end=at(60), granularity="all", reach=True)
        [row] = layer.ctr(query).rows
        assert (row.source, row.reach) == ("batch", NOT_MEASURED)
        [row] = layer.ctr(dataclasses.replace(query, start=at(1))).rows
        assert row.source == "batch"
        assert row.reach.exact
        assert row.reach.reach == len({u for r in newer for u in r["users"]})  # type: ignore[attr-defined]
    finally:
        layer.close()


def _parts(
    granularity: str, start: int, end: int, *covered: tuple[int, int]
) -> list[tuple[int, int]]:
    """CtrQuery.whole_buckets in minutes after T0."""
    query = CtrQuery.create(start=at(start), end=at(end), granularity=granularity)
    whole = query.whole_buckets([(at(lo), at(hi)) for lo, hi in covered])
    return [
        ((lo - T0) // dt.timedelta(minutes=1), (hi - T0) // dt.timedelta(minutes=1))
        for lo, hi in whole
    ]


def test_whole_buckets_are_the_buckets_wholly_in_the_covered_intervals() -> None:
    # Hours: the clipped first and last buckets count when wholly covered.
    assert _parts("hour", 30, 300, (0, 150)) == [(30, 120)]
    assert _parts("hour", 30, 300, (30, 60), (60, 120), (130, 300)) == [(30, 120), (180, 300)]
    assert _parts("hour", 30, 290, (100, 400)) == [(120, 290)]
    assert _parts("hour", 0, 240, (10, 50)) == []
    # Minutes: every covered minute.
    assert _parts("minute", 0, 60, (10, 20), (30, 31)) == [(10, 20), (30, 31)]
    # The whole range, one bucket: covered whole or not at all.
    assert _parts("all", 30, 300, (0, 400)) == [(30, 300)]
    assert _parts("all", 30, 300, (0, 200), (200, 400)) == [(30, 300)]
    assert _parts("all", 30, 300, (0, 299)) == []
    # Days: from midnight UTC (T0 is 10:00).
    assert _parts("day", 0, 28 * 60, (0, 28 * 60)) == [(0, 28 * 60)]
    assert _parts("day", 0, 28 * 60, (60, 28 * 60)) == [(14 * 60, 28 * 60)]


def test_a_bucket_is_counted_from_numbers_or_from_ids_and_one_mixing_them_is_estimated(
    lake: LakeSettings,
) -> None:
    """A run before the dictionary listed ids (minutes 0-59), a run since lists numbers
    (60-119): each hour is exact, the truth; a bucket over both kinds is not counted (a user
    would be counted twice, once by id and once by number): its reach is the sketches'
    estimate, close to the truth."""
    rng = random.Random(7)
    old, new = _rows(rng, range(0, 60), lists=True), _rows(rng, range(60, 120), lists=True)
    truth: list[set[str]] = [set(), set()]
    for hour, rows in enumerate((old, new)):
        for r in rows:
            truth[hour].update(r["users"])  # type: ignore[arg-type]
    numbered = [
        reached({k: v for k, v in r.items() if k not in ("users", "clickers")},
                r["users"], r["clickers"], numbers=NUMBERS)  # type: ignore[arg-type]
        for r in new
    ]  # fmt: skip
    write_batch(lake, "run-a", old)
    write_batch(lake, "run-b", numbered)
    cover(lake, "run-a", at(0), at(60))
    cover(lake, "run-b", at(60), at(120))
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        hours = _answer(layer, {"granularity": "hour", "end": at(120)})
        assert [(r.reach.exact, r.reach.reach) for r in hours] == [
            (True, len(truth[0])),
            (True, len(truth[1])),
        ]
        [both] = _answer(layer, {"granularity": "all", "end": at(120)})
        everyone = len(truth[0] | truth[1])
        assert both.source == "batch"
        assert not both.reach.exact
        assert both.reach.reach != len(truth[0]) + len(truth[1])  # not counted twice
        assert both.reach.low is not None
        assert both.reach.high is not None
        assert both.reach.low <= everyone <= both.reach.high
    finally:
        layer.close()
