"""The view counted in Arrow (:func:`views.ctr.ctr_arrow`, :func:`views.ctr.group_arrow`: the
speed layer's tasks, and the batch job's with reach) with who each row reached: counts, sketches
of the distinct ids, sorted lists of the distinct numbers; nulls are nobody."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest

from views import sketches
from views.columns import DIMENSIONS
from views.ctr import ctr_arrow, group_arrow

EVENTS = pa.schema(
    [
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("event_type", pa.string()),
        *((name, pa.string()) for name in DIMENSIONS),
        ("user_id", pa.string()),
        ("user_no", pa.int32()),
    ]
)


def test_each_group_is_counted_listed_and_sketched() -> None:
    at = dt.datetime(2026, 11, 21, 10, 0, 5, tzinfo=dt.UTC)
    dims = {"campaign_id": "cmp-1", "ad_id": "ad-1", "site_id": "s", "country": "DE"}
    rows = [
        # (seconds after 10:00:05, type, device, user id, user number)
        (0, "impression", "mobile", "user-9", 9),
        (1, "impression", "mobile", "user-2", 2),
        (2, "impression", "mobile", "user-9", 9),
        (3, "click", "mobile", "user-2", 2),
        (4, "impression", "mobile", None, None),  # nobody
        (60, "impression", "mobile", "user-5", 5),  # the next minute
        (5, "click", "desktop", "user-7", 7),  # other dimensions: a click alone
    ]
    events = pa.Table.from_pylist(
        [
            {"event_time": at + dt.timedelta(seconds=s), "event_type": kind, **dims,
             "device_type": device, "user_id": user, "user_no": number}
            for s, kind, device, user, number in rows
        ],
        schema=EVENTS,
    )  # fmt: skip
    found = {
        (r["bucket_start"].minute, r["device_type"]): r
        for r in ctr_arrow(events, reach=True, numbered=True).to_pylist()
    }
    assert set(found) == {(0, "mobile"), (1, "mobile"), (0, "desktop")}
    first = found[(0, "mobile")]
    assert (first["impressions"], first["clicks"]) == (4, 1)
    assert (first["user_nos"], first["clicker_nos"]) == ([2, 9], [2])
    assert round(sketches.sketch_estimate(first["reach_sketch"])) == 2
    assert round(sketches.sketch_estimate(first["clicker_sketch"])) == 1
    alone = found[(0, "desktop")]
    assert (alone["impressions"], alone["clicks"], alone["user_nos"]) == (0, 1, [])
    assert round(sketches.sketch_estimate(alone["reach_sketch"])) == 0
    assert found[(1, "mobile")]["user_nos"] == [5]


def test_many_numbers_are_listed_in_order() -> None:
    at = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
    numbers = random.Random(3).sample(range(100_000), 500)
    events = pa.Table.from_pylist(
        [
            {"event_time": at + dt.timedelta(seconds=n % 120), "event_type": "impression",
             "campaign_id": "c", "ad_id": "a", "site_id": f"s{n % 3}", "country": "DE",
             "device_type": "mobile", "user_id": f"user-{n}", "user_no": n}
            for n in numbers
        ],
        schema=EVENTS,
    )  # fmt: skip
    rows = ctr_arrow(events, reach=True, numbered=True).to_pylist()
    assert len(rows) == 6
    assert sum(len(r["user_nos"]) for r in rows) == 500
    for row in rows:
        assert row["user_nos"] == sorted(row["user_nos"])
        assert row["impressions"] == len(row["user_nos"])


def test_measures_of_each_row_are_summed_and_numbers_need_reach() -> None:
    at = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
    rows = pa.table(
        {
            "bucket_start": pa.array([at, at, at], pa.timestamp("us", tz="UTC")),
            **{name: ["x", "x", "x"] for name in DIMENSIONS},
            "impressions": pa.array([1, 1, 0], pa.int64()),
            "repeat_clicks": pa.array([0, 2, 0], pa.int64()),
        }
    )
    [row] = group_arrow(rows, ["impressions", "repeat_clicks"]).to_pylist()
    assert (row["impressions"], row["repeat_clicks"]) == (2, 2)
    assert "reach_sketch" not in row
    with pytest.raises(ValueError, match="numbered needs reach"):
        group_arrow(rows, ["impressions"], numbered=True)


def test_a_task_of_an_empty_partition_yields_nothing() -> None:
    from views.ctr import _reach_task

    assert list(_reach_task(iter([]), measures=("impressions", "clicks"))) == []
