"""Where the hour rows stand in for their minutes (serving_layer.hour_rows,
serving_layer.ctr_sql.hour_check_sql), which hours a batch run writes them for
(batch_layer.hours), and how the user dictionary numbers a run's new users
(batch_layer.users): the pure parts, without Spark."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from batch_layer.hours import hour_rows, hours_touched, whole_hours
from batch_layer.interval import Interval
from batch_layer.users import task_offsets
from lake.catalog import hours_table
from serving_layer.ctr_sql import hour_check_sql
from serving_layer.hour_rows import candidate_hours, hours_of, joined, subtract
from serving_layer.query import CtrQuery
from views import bitmaps, sketches
from views.definitions import DEFINITIONS

T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC)


def at(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def test_candidate_hours_are_the_whole_covered_hours_inside_the_range() -> None:
    covered = [(at(0), at(2.5)), (at(3), at(5))]
    hourly = CtrQuery.create(start=at(0.5), end=at(4), granularity="hour")
    assert candidate_hours(hourly, covered) == [(at(1), at(2)), (at(3), at(4))]
    whole = CtrQuery.create(start=at(0), end=at(5), granularity="all")
    assert candidate_hours(whole, covered) == [(at(0), at(2)), (at(3), at(5))]
    minutes = CtrQuery.create(start=at(0), end=at(5), granularity="minute")
    assert candidate_hours(minutes, covered) == []  # an hour row holds 60 minute buckets
    assert candidate_hours(hourly, [(at(1.25), at(1.75))]) == []


def test_hours_are_split_and_joined_back() -> None:
    parts = [(at(0), at(2)), (at(3), at(4))]
    assert hours_of(parts) == [at(0), at(1), at(3)]
    assert joined(hours_of(parts)) == parts
    assert joined([at(0), at(2)]) == [(at(0), at(1)), (at(2), at(3))]


def test_subtract_leaves_what_the_bitmaps_do_not_count() -> None:
    exact = [(at(0.5), at(3)), (at(4), at(6))]
    assert subtract(exact, []) == exact
    assert subtract(exact, [(at(1), at(2))]) == [(at(0.5), at(1)), (at(2), at(3)), (at(4), at(6))]
    assert subtract(exact, [(at(0.5), at(3)), (at(4), at(5))]) == [(at(5), at(6))]
    assert subtract(exact, [(at(0), at(7))]) == []


def test_a_run_writes_hour_rows_for_its_whole_hours_and_replaces_every_hour_it_touches() -> None:
    assert whole_hours(Interval(at(0), at(2))) == Interval(at(0), at(2))
    assert whole_hours(Interval(at(0.5), at(2.5))) == Interval(at(1), at(2))
    assert whole_hours(Interval(at(0.25), at(0.75))) is None
    assert hours_touched(Interval(at(0.5), at(2.5))) == Interval(at(0), at(3))
    assert hours_touched(Interval(at(0), at(2))) == Interval(at(0), at(2))


def test_each_task_numbers_after_the_tasks_before_it() -> None:
    # Tasks 0, 2 and 5 found 3, 0 and 4 new users; the dictionary's largest number was 10.
    offsets = task_offsets({5: 4, 0: 3, 2: 0}, 10)
    assert offsets == {0: 10, 2: 13, 5: 13}
    numbers = [offsets[t] + 1 + i for t, n in {0: 3, 2: 0, 5: 4}.items() for i in range(n)]
    assert numbers == list(range(11, 18))  # dense, each once


def test_bitmap_batches_turn_lists_of_numbers_into_bitmaps() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"k": ["a", "b", "c"], "u": [[3, 1, 3], None, [None, 7]], "v": [[1], [2], []]}
    )
    [out] = list(bitmaps.bitmap_batches(iter([batch]), columns=("u",)))
    assert out.column("k").to_pylist() == ["a", "b", "c"]
    assert out.column("v").to_pylist() == [[1], [2], []]
    got = [set(BitMap.deserialize(b)) for b in out.column("u").to_pylist()]
    assert got == [{1, 3}, set(), {7}]
    assert bitmaps.union_size(out.column("u").to_pylist()) == 3
    assert bitmaps.union_size([None, bitmaps.EMPTY]) == 0


def test_hour_rows_sum_each_hour_and_combinations_minutes() -> None:
    ts = pa.timestamp("us", tz="UTC")
    dims = {"campaign_id": "c1", "ad_id": "a1", "site_id": "s1", "country": "DE"}
    one = sketches.sketch(["u1", "u2"])
    # Three minute rows of one hour and combination (shuffled among the others), one of a
    # second device, one of the next hour: given with their hour as bucket_start.
    minutes = pa.table(
        {
            "bucket_start": pa.array([at(0), at(1), at(0), at(0), at(0)], ts),
            **{name: [value] * 5 for name, value in dims.items()},
            "device_type": ["mobile", "mobile", "mobile", "desktop", "mobile"],
            "impressions": pa.array([2, 1, 3, 4, 0], pa.int64()),
            "clicks": pa.array([1, 0, 0, 2, 1], pa.int64()),
            "user_nos": pa.array([[1, 2], [9], [2, 5], [7], None], pa.list_(pa.int32())),
            "clicker_nos": pa.array([[1], [], [], [7], [3]], pa.list_(pa.int32())),
            "reach_sketch": [one, sketches.sketch(["u9"]), sketches.sketch(["u2", "u5"]),
                             sketches.sketch(["u7"]), None],
            "clicker_sketch": [sketches.sketch(["u1"]), None, None, sketches.sketch(["u7"]),
                               sketches.sketch(["u3"])],
        }
    )  # fmt: skip
    schema = hours_table(DEFINITIONS[0]).schema
    got = hour_rows(minutes, "run-1", schema)
    assert got.schema == schema
    rows = {(r["bucket_start"], r["device_type"]): r for r in got.to_pylist()}
    assert set(rows) == {(at(0), "mobile"), (at(0), "desktop"), (at(1), "mobile")}
    mobile = rows[(at(0), "mobile")]
    assert (mobile["impressions"], mobile["clicks"], mobile["run_id"]) == (5, 2, "run-1")
    assert set(BitMap.deserialize(mobile["user_bitmap"])) == {1, 2, 5}
    assert set(BitMap.deserialize(mobile["clicker_bitmap"])) == {1, 3}
    assert round(sketches.sketch_estimate(mobile["reach_sketch"])) == 3  # u1, u2, u5
    assert round(sketches.sketch_estimate(mobile["clicker_sketch"])) == 2  # u1, u3, a null skipped
    # A combination of one minute in its hour keeps that minute's sketch as it is.
    later = rows[(at(1), "mobile")]
    assert set(BitMap.deserialize(later["user_bitmap"])) == {9}
    assert later["clicker_sketch"] is None
    assert rows[(at(0), "desktop")]["reach_sketch"] == sketches.sketch(["u7"])


def test_a_group_of_null_sketches_is_null_and_of_one_sketch_that_sketch() -> None:
    starts = np.array([0, 2])
    one = sketches.sketch(["u1"])
    got = sketches.group_unions(pa.array([None, None, one, None], pa.binary()), starts)
    first, second = got.to_pylist()
    assert first is None
    assert second == one  # one sketch among nulls: its bytes, not read


def test_an_hour_stands_in_only_while_its_minute_and_hour_rows_are_one_runs() -> None:
    con = duckdb.connect()
    minute = dt.timedelta(minutes=1)
    minutes = [
        (at(0) + 5 * minute, "run-a"),
        (at(0) + 50 * minute, "run-a"),  # hour 0: one run, its hour rows: stands in
        (at(1) + 5 * minute, "run-a"),
        (at(1) + 40 * minute, "run-b"),  # hour 1: two runs' minutes
        (at(2) + 5 * minute, "run-c"),  # hour 2: a run stopped before its hour rows
        (at(3) + 5 * minute, "run-d"),  # hour 3: minute rows, no hour rows
    ]
    hours = [(at(0), "run-a"), (at(1), "run-a"), (at(2), "run-a"), (at(5), "run-e")]
    ts = pa.timestamp("us", tz="UTC")
    for name, rows in (("m", minutes), ("h", hours)):
        table = pa.table(
            {
                "bucket_start": pa.array([r[0] for r in rows], ts),
                "run_id": [r[1] for r in rows],
            }
        )
        con.register(name, table)
    sql, params = hour_check_sql(batch="m", hours="h", start=at(0), end=at(6))
    invalid = {
        dt.datetime.fromtimestamp(r[0] / 1e6, dt.UTC) for r in con.execute(sql, params).fetchall()
    }
    # Hour 4 has neither: not listed (it holds nothing either way); hour 5: hour rows only.
    assert invalid == {at(1), at(2), at(3), at(5)}
