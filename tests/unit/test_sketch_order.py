"""One answer per question: the union of the same reach sketches gives the same sketch and the
same estimate whatever order it is given them in, in Python (the API's rows) and in DuckDB's
``sketch_union(list(...))`` (the SQL sandbox, whose parallel ``list()`` has no order)."""

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
