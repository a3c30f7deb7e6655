"""Where the hour rows stand in for their minutes (serving_layer.hour_rows,
serving_layer.ctr_sql.hour_check_sql), which hours a batch run writes them for
(batch_layer.hours), and how the user dictionary numbers a run's new users
(batch_layer.users): the pure parts, without Spark."""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
from pyroaring import BitMap

from batch_layer.hours import hours_touched, whole_hours
from batch_layer.interval import Interval
from batch_layer.users import task_offsets
from serving_layer.ctr_sql import hour_check_sql
from serving_layer.hour_rows import candidate_hours, hours_of, joined, subtract
from serving_layer.query import CtrQuery
from views import bitmaps

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
