"""The reach cube's Arrow tasks (batch_layer.reach_cube): each task cubes its own minute rows, the
partial cubes are unioned by key. One row per hour and dimension value (and per hour for the
whole) with every number of its rows, whatever the rows' split over tasks and batches; nulls
skipped. And views.bitmaps' grouping of consecutive rows, which both steps use."""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from batch_layer.reach_cube import KEYS, WHOLE, partial_cube_batches, union_cube_batches
from views import bitmaps
from views.columns import DIMENSIONS, USER_BITMAPS

T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC)
SCHEMA = pa.schema(
    [
        ("bucket_start", pa.timestamp("us", tz="UTC")),
        *((name, pa.string()) for name in DIMENSIONS),
        ("user_nos", pa.list_(pa.int32())),
        ("clicker_nos", pa.list_(pa.int32())),
    ]
)
Key = tuple[object, ...]
Row = dict[str, Any]
Sets = dict[Key, list[set[int]]]


def _row(hour: int, values: Sequence[str | None], users: object, clickers: object) -> Row:
    return {
        "bucket_start": T0 + dt.timedelta(hours=hour),
        **dict(zip(DIMENSIONS, values, strict=True)),
        "user_nos": users,
        "clicker_nos": clickers,
    }


def _cubed(rows: list[Row], tasks: int, batch_rows: int, at_once: int) -> Sets:
    """The cube of ``rows`` split over ``tasks`` tasks, each given batches of ``batch_rows``
    and cubing ``at_once`` rows or more at a time; the partial rows shuffled, as an exchange
    may deliver them, then sorted by key (as Spark sorts them) and given to the union in
    batches of ``batch_rows`` (a key's rows over several batches)."""
    table = pa.Table.from_pylist(rows, SCHEMA)
    step = -(-len(rows) // tasks) if rows else 1
    partial: list[pa.RecordBatch] = []
    for start in range(0, len(rows), step):
        batches = table.slice(start, step).to_batches(max_chunksize=batch_rows)
        partial += partial_cube_batches(iter(batches), at_once)
    random.Random(len(rows)).shuffle(partial)
    exchanged = pa.Table.from_batches(partial, partial[0].schema) if partial else None
    ordered = (
        exchanged.sort_by([(k, "ascending") for k in KEYS]).to_batches(max_chunksize=batch_rows)
        if exchanged is not None
        else []
    )
    got: Sets = {}
    for batch in union_cube_batches(iter(ordered)):
        for row in batch.to_pylist():
            key = (row["bucket_start"], row["dimension"], row["value"])
            assert key not in got, f"{key} twice"
            got[key] = [set(BitMap.deserialize(row[name])) for name in USER_BITMAPS]
    return got


def _expected(rows: list[Row]) -> Sets:
    expected: Sets = defaultdict(lambda: [set(), set()])
    for row in rows:
        for dimension in (*DIMENSIONS, WHOLE):
            value = WHOLE if dimension == WHOLE else row[dimension]
            users, clickers = expected[(row["bucket_start"], dimension, value)]
            users.update(n for n in row["user_nos"] or () if n is not None)
            clickers.update(n for n in row["clicker_nos"] or () if n is not None)
    return dict(expected)


def test_each_hour_and_dimension_value_is_one_row_with_every_number_of_its_rows() -> None:
    rows = [
        _row(0, ["c1", "a1", "s1", "DE", "mobile"], [1, 2], [2]),
        _row(0, ["c1", "a2", "s1", "DE", "mobile"], [2, 3], None),
        _row(0, ["c2", "a3", "s2", None, "desktop"], [None, 7], []),
        _row(1, ["c1", "a1", "s1", "FR", "mobile"], [9, 10], [9]),
    ]
    got = _cubed(rows, tasks=2, batch_rows=1, at_once=1)
    assert got == _expected(rows)
    assert got[(T0, "campaign_id", "c1")] == [{1, 2, 3}, {2}]
    assert got[(T0, "country", None)] == [{7}, set()]
    assert got[(T0, WHOLE, WHOLE)] == [{1, 2, 3, 7}, {2}]
    assert got[(T0 + dt.timedelta(hours=1), WHOLE, WHOLE)] == [{9, 10}, {9}]


def test_no_rows_no_keys() -> None:
    assert list(partial_cube_batches(iter([]))) == []
    assert list(union_cube_batches(iter([]))) == []


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["a", "b", None]),
            st.sampled_from(["x", "y"]),
            st.lists(st.integers(0, 2**31 - 1), max_size=5),
        ),
        max_size=40,
    ),
    st.integers(1, 4),
    st.integers(1, 7),
    st.integers(1, 50),
)
def test_the_cube_is_each_keys_numbers_however_the_rows_are_split(
    drawn: list[tuple[int, str | None, str, list[int]]], tasks: int, batch_rows: int, at_once: int
) -> None:
    rows = [_row(h, [v, w, "s", v, w], n, n[:1]) for h, v, w, n in drawn]
    assert _cubed(rows, tasks, batch_rows, at_once) == _expected(rows)


def test_a_key_over_many_rows_and_tasks_holds_all_its_numbers() -> None:
    numbers = random.Random(3).sample(range(1_000_000), 50_000)
    rows = [
        _row(0, ["c", f"a{i}", "s", "DE", "m"], numbers[i : i + 1000], [])
        for i in range(0, len(numbers), 1000)
    ]
    got = _cubed(rows, tasks=3, batch_rows=7, at_once=10)
    assert got[(T0, WHOLE, WHOLE)][0] == set(numbers)
    assert got[(T0, "campaign_id", "c")][0] == set(numbers)


def test_groups_of_consecutive_rows_get_one_bitmap_each() -> None:
    lists = pa.array([[1, 2], None, [2, 3], [None, 4], []], pa.list_(pa.int32()))
    starts = np.array([0, 2, 4])
    got = bitmaps.group_bitmaps(lists, starts).to_pylist()
    assert [set(BitMap.deserialize(b)) for b in got] == [{1, 2}, {2, 3, 4}, set()]
