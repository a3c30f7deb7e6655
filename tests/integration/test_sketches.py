"""Reach sketches (views.sketches): the bytes Spark writes, unions that equal the sketch of the
whole, estimates within their stated error."""

from __future__ import annotations

import datasketches as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from views.sketches import LG_K, RELATIVE_ERROR, STD_DEVS, sketch, union, union_sketch


def test_spark_writes_the_same_sketch(spark: SparkSession) -> None:
    users = [f"user-{n:05d}" for n in range(0, 3000, 3)] + [None, ""]
    frame = spark.createDataFrame([(u,) for u in users], "user_id string")
    spark_bytes, spark_estimate = (
        frame.selectExpr(f"hll_sketch_agg(user_id, {LG_K}) AS s")
        .selectExpr("s", "hll_sketch_estimate(s)")
        .collect()[0]
    )
    # Its bytes read here, with Spark's estimate. (Not byte for byte this side's sketch: two
    # partitions' partial sketches merged use the union's estimator, which this side's
    # single sketch does not; both within the error.)
    read = ds.hll_sketch.deserialize(bytes(spark_bytes))
    assert (read.lg_config_k, read.tgt_type) == (LG_K, ds.tgt_hll_type.HLL_8)
    assert round(union([bytes(spark_bytes)]).value) == spark_estimate
    assert abs(union([sketch(users)]).value - spark_estimate) <= RELATIVE_ERROR * 1000
    # And Spark reads what is made here, unions included.
    halves = [sketch(users[:500]), sketch(users[400:])]
    merged = spark.createDataFrame([(h,) for h in halves], "s binary").selectExpr(
        "hll_sketch_estimate(hll_union_agg(s))"
    )
    assert merged.collect()[0][0] == round(union(halves).value)


@settings(max_examples=30, deadline=None)
@given(
    users=st.lists(st.integers(0, 50_000), max_size=3000),
    parts=st.integers(1, 60),
)
def test_the_union_of_minutes_is_the_hours_sketch(users: list[int], parts: int) -> None:
    ids = [f"u{n}" for n in users]
    minutes = [sketch(ids[i::parts]) for i in range(parts)]
    whole = union([sketch(ids)])
    assert union(minutes) == whole
    assert union([union_sketch(minutes[: parts // 2]), union_sketch(minutes[parts // 2 :])]) == (
        whole
    )


@pytest.mark.parametrize("distinct", [0, 1, 40, 1000, 20_000, 200_000])
def test_estimates_are_within_their_bounds(distinct: int) -> None:
    # Spread over 24 sketches, as a day of hourly rows is.
    estimate = union(sketch(f"user-{n}" for n in range(h, distinct, 24)) for h in range(24))
    assert estimate.low <= distinct <= estimate.high
    assert abs(estimate.value - distinct) <= 3 * RELATIVE_ERROR * max(distinct, 1)
    # The bounds: STD_DEVS standard errors either side of the estimate (or exact, for few).
    width = estimate.high - estimate.low
    assert width <= 2 * STD_DEVS * RELATIVE_ERROR * estimate.value * 1.01


def test_nulls_and_no_sketch_are_no_users() -> None:
    assert union([]).value == 0
    assert union([None, sketch([None, ""])]).value == 0
    assert pytest.approx(0.0162, abs=1e-4) == RELATIVE_ERROR


def test_sketches_are_stored_compact_with_the_updatable_ones_estimates() -> None:
    for distinct, size in ((1, 12), (5, 28), (5000, 2088)):
        users = [f"user-{n:07d}" for n in range(distinct)]
        stored = sketch(users)
        read = ds.hll_sketch.deserialize(stored)
        assert (read.tgt_type, len(stored)) == (ds.tgt_hll_type.HLL_4, size)
        updatable = ds.hll_sketch(LG_K, ds.tgt_hll_type.HLL_8)
        for user in users:
            updatable.update(user)
        assert union([stored]) == union([bytes(updatable.serialize_updatable())])
