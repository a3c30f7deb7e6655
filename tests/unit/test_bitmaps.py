"""views.bitmaps' streaming union (the reach cube's Arrow task): one bitmap per key of rows sorted
by key, whatever the batches' boundaries, nulls skipped."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from views import bitmaps

KEYS = ("hour", "dimension", "value")
COLUMNS = ("user_nos", "clicker_nos")


def _row(
    hour: int, dimension: str, value: str | None, users: object, clickers: object
) -> dict[str, object]:
    return {
        "hour": hour,
        "dimension": dimension,
        "value": value,
        "user_nos": users,
        "clicker_nos": clickers,
    }


def _batches(rows: Sequence[Mapping[str, object]], size: int) -> list[pa.RecordBatch]:
    schema = pa.schema(
        [
            ("hour", pa.int64()),
            ("dimension", pa.string()),
            ("value", pa.string()),
            ("user_nos", pa.list_(pa.int32())),
            ("clicker_nos", pa.list_(pa.int32())),
        ]
    )
    table = pa.Table.from_pylist(list(rows), schema)
    return table.to_batches(max_chunksize=size) if rows else []


def _unioned(batches: list[pa.RecordBatch]) -> dict[tuple[object, ...], list[set[int]]]:
    got: dict[tuple[object, ...], list[set[int]]] = {}
    for batch in bitmaps.union_sorted(iter(batches), KEYS, COLUMNS):
        for row in batch.to_pylist():
            key = tuple(row[k] for k in KEYS)
            assert key not in got, f"{key} twice"
            got[key] = [set(BitMap.deserialize(row[c])) for c in COLUMNS]
    return got


def test_each_key_is_one_row_with_every_number_of_its_rows() -> None:
    rows = [
        _row(1, "campaign_id", "c1", [1, 2], [2]),
        _row(1, "campaign_id", "c1", [2, 3], None),
        _row(1, "campaign_id", "c2", [None, 7], []),
        _row(1, "country", None, [9], [9]),
        _row(2, "country", None, [9, 10], []),
    ]
    for size in (1, 2, 5):  # a key's rows split over batches, or not
        assert _unioned(_batches(rows, size)) == {
            (1, "campaign_id", "c1"): [{1, 2, 3}, {2}],
            (1, "campaign_id", "c2"): [{7}, set()],
            (1, "country", None): [{9}, {9}],
            (2, "country", None): [{9, 10}, set()],
        }


def test_no_rows_no_keys() -> None:
    assert _unioned([]) == {}


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.sampled_from(["a", "b", None]),
            st.lists(st.integers(0, 2**31 - 1), max_size=5),
        ),
        max_size=40,
    ),
    st.integers(1, 7),
)
def test_the_union_is_the_set_of_each_keys_numbers(
    drawn: list[tuple[int, str | None, list[int]]], size: int
) -> None:
    drawn.sort(key=lambda r: (r[0], r[1] is not None, r[1] or ""))
    rows = [
        {"hour": h, "dimension": "d", "value": v, "user_nos": n, "clicker_nos": n[:1]}
        for h, v, n in drawn
    ]
    expected: dict[tuple[object, ...], list[set[int]]] = defaultdict(lambda: [set(), set()])
    for h, v, n in drawn:
        expected[(h, "d", v)][0].update(n)
        expected[(h, "d", v)][1].update(n[:1])
    assert _unioned(_batches(rows, size)) == dict(expected)


def test_a_key_over_many_rows_and_batches_holds_all_its_numbers() -> None:
    numbers = random.Random(3).sample(range(1_000_000), 50_000)
    rows = [_row(0, "*", "*", numbers[i : i + 1000], []) for i in range(0, len(numbers), 1000)]
    [[users, _]] = _unioned(_batches(rows, 7)).values()
    assert users == set(numbers)
