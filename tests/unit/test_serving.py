"""Serving layer: the merge rule per minute bucket, roll-ups and provenance, Wilson intervals,
freshness — over real Delta tables written by the tests (no Spark)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from lake.coverage.model import Coverage
from lake.settings import LakeSettings
from serving_layer.query import CtrQuery, QueryError, QueryLimits
from serving_layer.reader import SnapshotReader
from serving_layer.service import ServingLayer
from serving_layer.wilson import wilson_interval
from tests.support.lake_writer import (
    T0,
    cover,
    ctr_row,
    minute,
    write_batch,
    write_speed,
    write_status,
)

H = dt.timedelta(hours=1)


@pytest.fixture
def serving(lake: LakeSettings) -> Iterator[ServingLayer]:
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    yield layer
    layer.close()


def rows(
    serving: ServingLayer, granularity: str = "minute", **kwargs: object
) -> list[tuple[object, ...]]:
    query = CtrQuery.create(start=T0, end=T0 + 2 * H, granularity=granularity, **kwargs)  # type: ignore[arg-type]
    return [
        (r.bucket_start, *r.dimensions.values(), r.impressions, r.clicks, r.source, r.run_ids)
        for r in serving.ctr(query).rows
    ]


def test_empty_lake_answers_empty(serving: ServingLayer) -> None:
    result = serving.ctr(CtrQuery.create(start=T0, end=T0 + H))
    assert result.rows == []
    assert result.freshness.latest_covered_bucket is None
    assert result.freshness.latest_speed_bucket is None
    assert result.freshness.versions == {
        "batch/ctr": None,
        "batch/coverage": None,
        "speed/ctr": None,
        "master/arrivals": None,
        "views/registry": None,
    }


def test_covered_bucket_takes_batch_rows_uncovered_takes_speed_rows(
    lake: LakeSettings, serving: ServingLayer
) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(0), 10, 1), ctr_row(minute(1), 20, 2)])
    cover(lake, "run-a", minute(0), minute(1))  # minute 1 has batch rows but is not covered
    write_speed(
        lake, [ctr_row(minute(0), 99, 9), ctr_row(minute(1), 30, 3), ctr_row(minute(2), 5, 0)]
    )
    assert rows(serving) == [
        (minute(0), 10, 1, "batch", ("run-a",)),
        (minute(1), 30, 3, "speed", ()),
        (minute(2), 5, 0, "speed", ()),
    ]


def test_half_covered_hour_rolls_up_as_mixed(lake: LakeSettings, serving: ServingLayer) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(10), 100, 10), ctr_row(minute(40), 1000, 1)])
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(
        lake, [ctr_row(minute(10), 7, 7), ctr_row(minute(40), 50, 5), ctr_row(minute(70), 8, 1)]
    )
    assert rows(serving, "hour") == [
        (T0, 150, 15, "mixed", ("run-a",)),
        (T0 + H, 8, 1, "speed", ()),
    ]
    assert rows(serving, "day") == [(T0.replace(hour=0), 158, 16, "mixed", ("run-a",))]


def test_granularity_all_is_one_bucket_over_the_range(
    lake: LakeSettings, serving: ServingLayer
) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(10), 100, 10, campaign="c1")])
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(
        lake,
        [
            ctr_row(minute(10), 7, 7, campaign="c1"),  # covered: the batch row counts
            ctr_row(minute(40), 50, 5, campaign="c1"),
            ctr_row(minute(70), 8, 1, campaign="c2"),
        ],
    )
    # Starting mid-hour: the bucket starts where the range does, not on an hour.
    start, end = minute(5), minute(95)
    query = CtrQuery.create(start=start, end=end, granularity="all", group_by=["campaign_id"])
    assert [
        (r.bucket_start, r.dimensions, r.impressions, r.clicks, r.source, r.covered_fraction)
        for r in serving.ctr(query).rows
    ] == [
        (start, {"campaign_id": "c1"}, 150, 15, "mixed", 25 / 90),
        (start, {"campaign_id": "c2"}, 8, 1, "mixed", 25 / 90),
    ]
    covered = CtrQuery.create(start=minute(0), end=minute(30), granularity="all")
    [row] = serving.ctr(covered).rows
    assert (row.impressions, row.source, row.covered_fraction) == (100, "batch", 1.0)
    uncovered = CtrQuery.create(start=minute(30), end=minute(90), granularity="all")
    [row] = serving.ctr(uncovered).rows
    assert (row.impressions, row.source, row.covered_fraction) == (58, "speed", 0.0)


def test_rolled_up_rows_say_how_much_is_covered(lake: LakeSettings, serving: ServingLayer) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(10), 100, 10)])
    cover(lake, "run-a", minute(0), minute(45))
    write_speed(lake, [ctr_row(minute(50), 5, 1), ctr_row(minute(70), 8, 1)])
    query = CtrQuery.create(start=minute(15), end=minute(120), granularity="hour")
    # The first hour within the range is [10:15, 11:00): 30 of its 45 minutes covered.
    assert [(r.bucket_start, r.source, r.covered_fraction) for r in serving.ctr(query).rows] == [
        (T0, "mixed", 30 / 45),
        (T0 + H, "speed", 0.0),
    ]


def test_two_runs_with_a_gap_between_them(lake: LakeSettings, serving: ServingLayer) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(5), 10, 1)])
    write_batch(lake, "run-b", [ctr_row(minute(65), 20, 2)])
    cover(lake, "run-a", minute(0), minute(30))
    cover(lake, "run-b", minute(60), minute(120))
    write_speed(
        lake, [ctr_row(minute(5), 1, 1), ctr_row(minute(45), 30, 3), ctr_row(minute(65), 2, 2)]
    )
    assert rows(serving) == [
        (minute(5), 10, 1, "batch", ("run-a",)),
        (minute(45), 30, 3, "speed", ()),
        (minute(65), 20, 2, "batch", ("run-b",)),
    ]
    assert rows(serving, "hour") == [
        (T0, 40, 4, "mixed", ("run-a",)),
        (T0 + H, 20, 2, "batch", ("run-b",)),
    ]
    assert rows(serving, "day") == [(T0.replace(hour=0), 60, 6, "mixed", ("run-a", "run-b"))]


def test_overlapping_reruns_count_batch_rows_once(
    lake: LakeSettings, serving: ServingLayer
) -> None:
    write_batch(lake, "run-b", [ctr_row(minute(5), 10, 1)])
    cover(lake, "run-a", minute(0), minute(60))
    cover(lake, "run-b", minute(0), minute(60))  # a rerun of the same hour
    assert rows(serving, "hour") == [(T0, 10, 1, "batch", ("run-b",))]


def test_the_as_of_join_path_gives_the_same_answer(
    lake: LakeSettings, serving: ServingLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(5), 10, 1), ctr_row(minute(65), 20, 2)])
    cover(lake, "run-a", minute(0), minute(30))
    cover(lake, "run-a", minute(60), minute(90))
    write_speed(
        lake, [ctr_row(minute(5), 1, 1), ctr_row(minute(45), 30, 3), ctr_row(minute(95), 2, 2)]
    )
    expected = rows(serving, "hour")
    monkeypatch.setattr("serving_layer.service.MAX_PREDICATE_INTERVALS", 0)
    assert rows(serving, "hour") == expected
    assert expected == [(T0, 40, 4, "mixed", ("run-a",)), (T0 + H, 22, 4, "mixed", ("run-a",))]


def test_filters_group_by_order_and_limit(lake: LakeSettings, serving: ServingLayer) -> None:
    write_speed(
        lake,
        [
            ctr_row(minute(1), 10, 1, campaign="c1", country="US"),
            ctr_row(minute(2), 10, 5, campaign="c2", country="US"),
            ctr_row(minute(3), 10, 3, campaign="c3", country="DE"),
            ctr_row(minute(4), 10, 2, campaign="c1", country="DE"),
        ],
    )
    assert rows(serving, "hour", group_by=["campaign_id"], order_by=["-clicks"], limit=2) == [
        (T0, "c2", 10, 5, "speed", ()),
        (T0, "c1", 20, 3, "speed", ()),
    ]
    assert rows(serving, "hour", group_by=["campaign_id"], filters={"country": ["DE"]}) == [
        (T0, "c1", 10, 2, "speed", ()),
        (T0, "c3", 10, 3, "speed", ()),
    ]
    assert rows(
        serving, "hour", group_by=["country", "campaign_id"], filters={"campaign_id": ["c1", "c3"]}
    ) == [
        (T0, "DE", "c1", 10, 2, "speed", ()),
        (T0, "DE", "c3", 10, 3, "speed", ()),
        (T0, "US", "c1", 10, 1, "speed", ()),
    ]
    result = serving.ctr(CtrQuery.create(start=T0, end=T0 + H, granularity="minute", limit=3))
    assert result.truncated
    assert len(result.rows) == 3


def test_filter_values_are_bound_not_spliced(lake: LakeSettings, serving: ServingLayer) -> None:
    write_speed(lake, [ctr_row(minute(1), 10, 1, campaign="x' OR '1'='1")])
    assert rows(serving, filters={"campaign_id": ["x' OR '1'='1"]}) == [
        (minute(1), 10, 1, "speed", ())
    ]
    assert rows(serving, filters={"campaign_id": ["' OR 1=1 --"]}) == []


def test_rows_carry_ctr_and_wilson_interval(lake: LakeSettings, serving: ServingLayer) -> None:
    write_speed(lake, [ctr_row(minute(1), 100, 10), ctr_row(minute(2), 0, 1)])
    first, second = serving.ctr(CtrQuery.create(start=T0, end=T0 + H, granularity="minute")).rows
    assert first.ctr == pytest.approx(0.1)
    assert first.ctr_ci_low == pytest.approx(0.0552, abs=5e-5)
    assert first.ctr_ci_high == pytest.approx(0.1744, abs=5e-5)
    assert (second.ctr, second.ctr_ci_low, second.ctr_ci_high) == (None, None, None)


@pytest.mark.parametrize(
    ("clicks", "impressions", "low", "high"),
    [
        # Published four-decimal values (e.g. Newcombe 1998, Table I; Wikipedia).
        (10, 100, 0.0552, 0.1744),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (1, 2, 0.0945, 0.9055),
        (500, 1000, 0.4691, 0.5309),
        (12, 10, 0.7225, 1.0),  # more clicks than impressions: capped at a proportion of 1
    ],
)
def test_wilson_interval_known_values(
    clicks: int, impressions: int, low: float, high: float
) -> None:
    assert list(wilson_interval(clicks, impressions) or ()) == [
        pytest.approx(low, abs=5e-5),
        pytest.approx(high, abs=5e-5),
    ]


def test_wilson_interval_without_impressions() -> None:
    assert wilson_interval(3, 0) is None


def test_coverage_merges_overlaps_and_classifies_spans() -> None:
    coverage = Coverage(
        [(minute(30), minute(90)), (minute(0), minute(60)), (minute(120), minute(150))]
    )
    assert [(i.start, i.end) for i in coverage.intervals] == [
        (minute(0), minute(90)),
        (minute(120), minute(150)),
    ]
    assert coverage.latest_bucket == minute(149)
    assert coverage.source(minute(0), minute(60)) == "batch"
    assert coverage.source(minute(60), minute(120)) == "mixed"
    assert coverage.source(minute(90), minute(120)) == "speed"
    assert coverage.within(minute(80), minute(130)) == [
        (minute(80), minute(90)),
        (minute(120), minute(130)),
    ]
    assert coverage.covers(minute(89))
    assert not coverage.covers(minute(90))


def test_freshness(lake: LakeSettings, serving: ServingLayer) -> None:
    write_batch(lake, "run-a", [ctr_row(minute(5), 10, 1)])
    cover(lake, "run-a", minute(0), minute(60))
    write_speed(lake, [ctr_row(minute(61), 1, 0), ctr_row(minute(75), 1, 0)])
    write_status(lake, offsets_behind=17)
    fresh = serving.freshness()
    assert fresh.latest_covered_bucket == minute(59)
    assert fresh.latest_speed_bucket == minute(75)
    assert fresh.speed_lag_records == 17
    assert fresh.speed_updated_at == dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
    assert fresh.speed_watermark == dt.datetime(2026, 11, 22, 11, 58, tzinfo=dt.UTC)
    assert fresh.versions == {
        "batch/ctr": 0,
        "batch/coverage": 0,
        "speed/ctr": 0,
        "master/arrivals": None,
        "views/registry": None,
    }


def test_a_garbled_status_file_means_unknown_lag(lake: LakeSettings, serving: ServingLayer) -> None:
    path = Path(lake.checkpoint_root) / "speed.status.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"updated_at": ')
    assert serving.freshness().speed_lag_records is None


def test_a_request_keeps_its_snapshot_while_tables_change(
    lake: LakeSettings, serving: ServingLayer
) -> None:
    write_speed(lake, [ctr_row(minute(1), 10, 1)])
    pinned = serving.reader.snapshot()
    write_speed(lake, [ctr_row(minute(2), 10, 1)])
    query = CtrQuery.create(start=T0, end=T0 + H, granularity="minute")
    assert len(serving.ctr(query, pinned).rows) == 1
    assert len(serving.ctr(query).rows) == 2


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"end": T0}, "end"),
        ({"end": T0 + dt.timedelta(days=40)}, "end"),
        ({"granularity": "week"}, "granularity"),
        ({"group_by": ["campaign"]}, "group_by"),
        ({"filters": {"city": ["x"]}}, "city"),
        ({"order_by": ["country"]}, "order_by"),
        ({"order_by": ["-revenue"]}, "order_by"),
        ({"limit": 0}, "limit"),
        ({"start": T0.replace(tzinfo=None)}, "start"),
        ({"filters": {"country": ["US", "xx"]}}, "country"),
    ],
)
def test_invalid_queries_name_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    arguments: dict[str, object] = {"start": T0, "end": T0 + H, **kwargs}
    with pytest.raises(QueryError, match=f"^{parameter}: ") as caught:
        QueryLimits().check(CtrQuery.create(**arguments))  # type: ignore[arg-type]
    assert caught.value.parameter == parameter


def test_a_country_in_lower_case_is_refused_with_the_code_meant() -> None:
    """``country=us`` would select nothing, silently: the events carry upper-case codes."""
    with pytest.raises(QueryError, match=r"^country: .* got 'us' \(did you mean 'US'\?\)$"):
        CtrQuery.create(start=T0, end=T0 + H, filters={"country": ["us"]})


def test_the_limits_of_a_deployment_bound_range_and_rows() -> None:
    query = CtrQuery.create(start=T0, end=T0 + dt.timedelta(days=40), limit=500)
    assert QueryLimits(max_range=dt.timedelta(days=60)).check(query) is query
    with pytest.raises(QueryError, match=r"^limit: must be between 1 and 100"):
        QueryLimits(max_range=dt.timedelta(days=60), max_limit=100).check(query)


def test_bounds_round_up_to_the_minute() -> None:
    query = CtrQuery.create(
        start=T0 + dt.timedelta(seconds=1), end=T0 + dt.timedelta(minutes=5, seconds=30)
    )
    assert (query.start, query.end) == (minute(1), minute(6))


def test_a_time_limit_reached_before_the_query_starts_still_stops_it() -> None:
    """The time limit's interrupt is repeated until the query is done: one that lands before
    DuckDB started the query (on a busy machine) is lost, and the query would run unbounded."""
    import threading

    import duckdb

    from serving_layer.reader import _interrupt_until_done

    con = duckdb.connect()
    done = threading.Event()
    interrupter = threading.Thread(target=_interrupt_until_done, args=(con, 0.0, done))
    interrupter.start()  # already past its limit: interrupting an idle connection, then the query
    try:
        with pytest.raises(duckdb.InterruptException):
            con.execute("SELECT sum(a.range * b.range) FROM range(200000) a, range(200000) b")
    finally:
        done.set()
        interrupter.join()
        con.close()
