"""One answer per question: the union of the same reach sketches gives the same sketch and the
same estimate whatever order it is given them in, in Python (the API's rows) and in DuckDB's
``sketch_union(list(...))`` (the SQL sandbox, whose parallel ``list()`` has no order), and the
same estimate whatever their grouping (a day's minute sketches, or its hour sketches made of
them, as the batch layer's hour rows hold)."""

from __future__ import annotations

import random

import datasketches as ds
import duckdb
import pyarrow as pa

from views import sketches


def _parts(seed: int = 3) -> list[bytes]:
    """Sketches of a few to a few dozen users each (a minute's row), overlapping, about 1,500
    users together: each in its small (list or set) mode, their union past it, where the
    union's estimate (HIP) depends on the order its users came in."""
    rng = random.Random(seed)
    return [
        sketches.sketch(f"user-{rng.randrange(20_000)}" for _ in range(rng.choice([3, 10, 40])))
        for _ in range(80)
    ]


def _naive(parts: list[bytes]) -> float:
    union = ds.hll_union(sketches.LG_K)
    for data in parts:
        union.update(ds.hll_sketch.deserialize(data))
    return float(union.get_estimate())


def test_a_union_in_any_order_is_the_same_sketch() -> None:
    parts = _parts()
    rng = random.Random(11)
    first = sketches.union_sketch(parts)
    naive = set()
    for _ in range(40):
        rng.shuffle(parts)
        assert sketches.union_sketch(parts) == first
        assert sketches.union(parts).value == sketches.union(list(reversed(parts))).value
        naive.add(_naive(parts))
    # Without the fixed order, the same sketches give several estimates: what the test guards.
    assert len(naive) > 1


def test_duckdbs_parallel_union_says_what_the_api_says() -> None:
    parts = _parts(seed=4)
    expected = sketches.union(parts).value
    con = duckdb.connect(config={"threads": 2})
    sketches.register(con)
    rows = pa.table({"s": pa.array(parts * 50, pa.binary()), "k": list(range(len(parts) * 50))})
    con.register("rows", rows)
    estimates = {
        con.execute(
            "SELECT sketch_estimate(sketch_union(list(s))) "
            "FROM (SELECT s FROM rows ORDER BY random())"
        ).fetchone()[0]  # type: ignore[index]
        for _ in range(10)
    }
    assert estimates == {expected}


def _hip(sketch: bytes) -> float:
    """What DataSketches itself says of ``sketch`` (its HIP estimate past the small modes)."""
    return float(ds.hll_sketch.deserialize(sketch).get_estimate())


def test_the_same_users_give_the_same_estimate_in_minutes_or_in_hours() -> None:
    rng = random.Random(5)
    minutes = [
        sketches.sketch(f"user-{rng.randrange(200_000)}" for _ in range(rng.choice([3, 10, 40])))
        for _ in range(1_200)
    ]
    hours = [sketches.union_sketch(minutes[i : i + 60]) for i in range(0, len(minutes), 60)]
    shuffled = minutes[:]
    rng.shuffle(shuffled)
    by_minute, by_hour = sketches.union(minutes), sketches.union(hours)
    assert by_minute == by_hour == sketches.union(shuffled)
    # The sandbox's functions say the same of either.
    con = duckdb.connect()
    sketches.register(con)
    for parts in (minutes, hours):
        con.register("rows", pa.table({"s": pa.array(parts, pa.binary())}))
        sql = "SELECT sketch_estimate(sketch_union(list(s))) FROM rows"
        assert con.execute(sql).fetchone() == (by_minute.value,)
    # Without reading the registers, the two unions say different numbers: the guard's point.
    assert _hip(sketches.union_sketch(minutes)) != _hip(sketches.union_sketch(hours))


def test_a_small_union_is_its_users_count() -> None:
    users = [f"user-{n}" for n in range(50)]
    parts = [sketches.sketch(users[i : i + 7]) for i in range(0, 50, 7)]
    assert round(sketches.union(parts).value) == 50
