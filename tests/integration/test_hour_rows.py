"""The batch layer's hour rows and user dictionary (batch/ctr_hours, batch/users), and the
serving layer reading them in place of their minute rows: exact where the minutes were, the
same estimate where they were estimated, and never where they would be wrong (a range or a
coverage that starts or ends mid-hour, a stale hour, a speed hour, a run stopped between its
minute commit and its hour commit).

Real Spark (the batch job over master/events on disk), real Delta tables, the serving layer's
DuckDB, against generated traffic with known users."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyroaring import BitMap
from pyspark.sql import SparkSession

from batch_layer import job as batch_job
from batch_layer import users as users_module
from batch_layer.interval import Interval
from batch_layer.job import run
from batch_layer.users import commit as commit_users
from batch_layer.users import dictionary_files
from events.model import Event
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake import view_files
from lake.arrivals import arrivals_table
from lake.catalog import BATCH_USERS, MASTER_EVENTS, batch_table, hours_table, reach_cube_table
from lake.data_files import DataFile, write_files
from lake.settings import LakeSettings
from runtime.connectors import is_commit_conflict
from serving_layer.query import CtrQuery
from serving_layer.reader import SnapshotReader
from serving_layer.service import CtrRow, ServingLayer
from tests.integration.test_reach import truth, within_error, write_speed_rows
from tests.support.events import archive, archived
from tests.support.lake_writer import arrival_rows
from views import sketches
from views.columns import DIMENSIONS
from views.definitions import definition

T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
V1 = definition("ctr", 1)


def at(hours: float) -> dt.datetime:
    return T0 + hours * HOUR


def generated(seed: int, hours: float, users: int = 3_000) -> list[Event]:
    """About ``hours`` of events from ``users`` users, deduplicated by event id."""
    config = TrafficConfig(
        seed=seed,
        start_ms=int(T0.timestamp() * 1000),
        events_per_second=1.5,
        campaigns=3,
        ads_per_campaign=3,
        sites=4,
        users=users,
        duplicate_fraction=0.02,
    )
    count = int(hours * 3600 * 1.5)
    records = zip(range(count), TrafficGenerator(config), strict=False)
    events = [record.event for _, record in records if record.event is not None]
    return list({e.event_id: e for e in reversed(events)}.values())


def layer_of(lake: LakeSettings) -> ServingLayer:
    return ServingLayer(SnapshotReader(lake, refresh_s=0))


def reach_rows(layer: ServingLayer, **params: object) -> list[CtrRow]:
    return layer.ctr(CtrQuery.create(**params, reach=True)).rows  # type: ignore[arg-type]


def hours_used(layer: ServingLayer, **params: object) -> list[tuple[dt.datetime, dt.datetime]]:
    """The hours whose hour rows the answer to ``params`` reads."""
    query = CtrQuery.create(**params, reach=True)  # type: ignore[arg-type]
    snap = layer.reader.snapshot()
    view = layer.reader.definition(snap)
    return layer.planner.hours_used(query, snap, view)


def in_range(e: Event, start: dt.datetime, end: dt.datetime) -> bool:
    return start.timestamp() * 1000 <= e.event_time < end.timestamp() * 1000


@pytest.fixture(scope="module")
def covered(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[LakeSettings, list[Event]]:
    """Batch runs over [10:00, 12:00) (two whole hours) and [12:00, 12:30) (part of one);
    speed rows from 12:30 to 13:30."""
    lake = LakeSettings(lake_root=str(tmp_path_factory.mktemp("hours") / "lake"))
    events = generated(seed=41, hours=3.5)
    archive(spark, lake, [archived(e, offset) for offset, e in enumerate(events)])
    run(spark, Interval(at(0), at(2)), lake=lake, definition=V1)
    run(spark, Interval(at(2), at(2.5)), lake=lake, definition=V1)
    write_speed_rows(lake, [e for e in events if e.event_time >= at(2.5).timestamp() * 1000])
    return lake, events


def dictionary(lake: LakeSettings) -> dict[int, str]:
    table = DeltaTable(BATCH_USERS.path(lake)).to_pyarrow_table()
    return dict(zip(table["user_no"].to_pylist(), table["user_id"].to_pylist(), strict=True))


def test_the_dictionary_numbers_every_user_of_the_runs_once(
    covered: tuple[LakeSettings, list[Event]],
) -> None:
    lake, events = covered
    table = DeltaTable(BATCH_USERS.path(lake)).to_pyarrow_table()
    numbers, ids = table["user_no"].to_pylist(), table["user_id"].to_pylist()
    assert sorted(numbers) == list(range(1, len(numbers) + 1))  # dense, each once
    assert len(set(ids)) == len(ids)
    assert set(ids) == {e.user_id for e in events if in_range(e, at(0), at(2.5))}


def test_a_minute_row_holds_its_users_numbers_not_their_ids(
    covered: tuple[LakeSettings, list[Event]],
) -> None:
    lake, events = covered
    names = dictionary(lake)
    rows = DeltaTable(batch_table(V1).path(lake)).to_pyarrow_table().to_pylist()
    seen: dict[tuple[object, ...], set[str]] = defaultdict(set)
    clicked: dict[tuple[object, ...], set[str]] = defaultdict(set)
    for e in events:
        if in_range(e, at(0), at(2.5)):
            minute = dt.datetime.fromtimestamp(e.event_time // 60_000 * 60, dt.UTC)
            key = (minute, e.campaign_id, e.ad_id, e.site_id, e.country, e.device_type)
            (seen if e.event_type == "impression" else clicked)[key].add(e.user_id)
    assert len(rows) == len(seen.keys() | clicked.keys())
    for r in rows:
        key = (r["bucket_start"], *(r[d] for d in DIMENSIONS))
        assert (r["users"], r["clickers"]) == (None, None)
        assert r["user_nos"] == sorted(r["user_nos"])
        assert {names[n] for n in r["user_nos"]} == seen[key]
        assert {names[n] for n in r["clicker_nos"]} == clicked[key]


def test_an_hour_row_holds_its_minutes_users_and_counts(
    covered: tuple[LakeSettings, list[Event]],
) -> None:
    lake, events = covered
    names = dictionary(lake)
    rows = DeltaTable(hours_table(V1).path(lake)).to_pyarrow_table().to_pylist()
    # The two whole hours of the first run; none for the half hour of the second.
    assert {r["bucket_start"] for r in rows} == {at(0), at(1)}
    assert {r["run_id"] for r in rows} == {"ctr-20261123T1000-20261123T1200-v0"}
    users: dict[tuple[object, ...], set[str]] = defaultdict(set)
    impressions: dict[tuple[object, ...], int] = defaultdict(int)
    clicks: dict[tuple[object, ...], int] = defaultdict(int)
    for e in events:
        if not in_range(e, at(0), at(2)):
            continue
        hour = dt.datetime.fromtimestamp(e.event_time // 3_600_000 * 3600, dt.UTC)
        key = (hour, e.campaign_id, e.ad_id, e.site_id, e.country, e.device_type)
        if e.event_type == "impression":
            users[key].add(e.user_id)
            impressions[key] += 1
        else:  # a combination with clicks and no impression in the hour has a row too
            users.setdefault(key, set())
            clicks[key] += 1
    got = {
        (r["bucket_start"], r["campaign_id"], r["ad_id"], r["site_id"], r["country"],
         r["device_type"]): r
        for r in rows
    }  # fmt: skip
    assert set(got) == set(users)
    for key, row in got.items():
        assert {names[n] for n in BitMap.deserialize(row["user_bitmap"])} == users[key]
        assert (row["impressions"], row["clicks"]) == (impressions[key], clicks[key])
        # The hour's sketch: the union of its minutes', the same registers.
        assert (
            sketches.sketch_estimate(row["reach_sketch"])
            == sketches.union([sketches.sketch(users[key])]).value
        )


def test_the_reach_cube_holds_each_dimension_values_users_per_whole_hour(
    covered: tuple[LakeSettings, list[Event]],
) -> None:
    lake, events = covered
    names = dictionary(lake)
    rows = DeltaTable(reach_cube_table(V1).path(lake)).to_pyarrow_table().to_pylist()
    users: dict[tuple[object, ...], set[str]] = defaultdict(set)
    clickers: dict[tuple[object, ...], set[str]] = defaultdict(set)
    for e in events:
        if not in_range(e, at(0), at(2)):  # the whole hours of the first run only
            continue
        hour = dt.datetime.fromtimestamp(e.event_time // 3_600_000 * 3600, dt.UTC)
        for dimension, value in (*((d, getattr(e, d)) for d in DIMENSIONS), ("*", "*")):
            key = (hour, dimension, value)
            users[key]  # a value with clicks only in the hour has a row too
            if e.event_type == "impression":
                users[key].add(e.user_id)
            else:
                clickers[key].add(e.user_id)
    got = {(r["bucket_start"], r["dimension"], r["value"]): r for r in rows}
    assert set(got) == set(users)
    assert {r["run_id"] for r in rows} == {"ctr-20261123T1000-20261123T1200-v0"}
    for key, row in got.items():
        assert {names[n] for n in BitMap.deserialize(row["user_bitmap"])} == users[key]
        assert {names[n] for n in BitMap.deserialize(row["clicker_bitmap"])} == clickers[key]


def test_a_range_that_starts_and_ends_mid_hour_is_exact_in_every_covered_bucket(
    covered: tuple[LakeSettings, list[Event]],
) -> None:
    lake, events = covered
    layer = layer_of(lake)
    try:
        params: dict[str, object] = {"start": at(0.5), "end": at(2.5), "granularity": "hour"}
        # Only the hour that is whole in the range and covered by one run reads its hour row.
        assert hours_used(layer, **params) == [(at(1), at(2))]
        rows = reach_rows(layer, **params, group_by=["campaign_id"])
        # The clipped buckets are keyed by their hour's start, their users those of the range.
        expected = truth(
            events,
            at(0.5),
            at(2.5),
            lambda e: (
                dt.datetime.fromtimestamp(e.event_time // 3_600_000 * 3600, dt.UTC),
                e.campaign_id,
            ),
        )
        assert {r.bucket_start for r in rows} == {at(0), at(1), at(2)}
        for row in rows:
            assert (row.source, row.reach.exact) == ("batch", True)
            assert row.reach.reach == expected[(row.bucket_start, row.dimensions["campaign_id"])]
        # The whole range as one bucket: its edges are minutes, so its minute rows count it.
        [total] = reach_rows(layer, start=at(0.5), end=at(2.5), granularity="all")
        assert total.reach.reach == truth(events, at(0.5), at(2.5), lambda e: ())[()]
        # Two whole hours as one bucket: their hour rows alone.
        params = {"start": at(0), "end": at(2), "granularity": "all"}
        assert hours_used(layer, **params) == [(at(0), at(2))]
        [hours] = reach_rows(layer, **params, group_by=[])
        assert hours.reach.reach == truth(events, at(0), at(2), lambda e: ())[()]
        assert (
            hours.reach.clicking_users
            == truth(events, at(0), at(2), lambda e: (), kind="click")[()]
        )
    finally:
        layer.close()


def test_a_speed_hour_is_estimated_and_hour_sketches_say_what_minute_sketches_say(
    covered: tuple[LakeSettings, list[Event]],
) -> None:
    lake, events = covered
    layer = layer_of(lake)
    try:
        rows = reach_rows(layer, start=at(2.5), end=at(3.5), granularity="all")
        assert [(r.source, r.reach.exact) for r in rows] == [("speed", False)]
        assert within_error(rows[0], truth(events, at(2.5), at(3.5), lambda e: ())[()])
        # Across batch hours and speed minutes: one bucket, estimated, the two batch hours
        # from their hour sketches. The minutes' sketches of the same rows give the same number.
        params: dict[str, object] = {"start": at(0), "end": at(3.5), "granularity": "all"}
        assert hours_used(layer, **params) == [(at(0), at(2))]
        # The plan reads those hours' sketches (the cube counts no estimated bucket).
        query = CtrQuery.create(**params, reach=True)  # type: ignore[arg-type]
        view = layer.reader.definition(layer.reader.snapshot())
        plan = layer.planner.plan(query, layer.reader.snapshot(), view, [])
        assert (plan.used, plan.by_cube) == ([(at(0), at(2))], [])
        [mixed] = reach_rows(layer, **params)
        assert mixed.source == "mixed"
        assert within_error(mixed, truth(events, at(0), at(3.5), lambda e: ())[()])
        snap = layer.reader.snapshot()
        minute_sketches = [
            r[0]
            for name, end in (("batch/ctr", at(2.5)), ("speed/ctr", at(3.5)))
            for r in layer.reader.fetch_all(
                f"SELECT reach_sketch FROM {layer.reader.relation_name(snap[name])} "
                "WHERE bucket_start >= $start AND bucket_start < $end",
                {"start": at(0) if name == "batch/ctr" else at(2.5), "end": end},
            )[1]
        ]
        assert mixed.reach.reach == round(sketches.union(minute_sketches).value)
    finally:
        layer.close()


def record_arrivals(lake: LakeSettings, late: list[Event]) -> None:
    """``late`` (archived last) as the archiver records its arrivals (master/arrivals)."""
    version = DeltaTable(MASTER_EVENTS.path(lake)).version()
    arrivals = arrivals_table(lake)
    for n, e in enumerate(late):
        row = {
            "bucket_start": dt.datetime.fromtimestamp(e.event_time // 60_000 * 60, dt.UTC),
            **{d: getattr(e, d) for d in DIMENSIONS},
            "impressions": 1,
            "clicks": 0,
        }
        arrivals.append(arrival_rows(row, events_version=version), app_id="late", version=n)


def test_a_stale_hour_and_a_run_stopped_between_its_commits(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Late events in a covered hour make it stale: its reach is the run's (from its hour
    rows), its bound holds the late users. A run stopped after its minute commit leaves the
    hour rows of the run before: the serving layer counts that hour from the minute rows
    (exact for what they hold) until a run writes both again."""
    lake = LakeSettings(lake_root=str(tmp_path / "lake"))
    events = generated(seed=43, hours=2, users=1_500)
    archive(spark, lake, [archived(e, offset) for offset, e in enumerate(events)])
    run(spark, Interval(at(0), at(2)), lake=lake, definition=V1)
    late = [
        e
        for e in generated(seed=44, hours=2, users=2_000)
        if in_range(e, at(1), at(2)) and e.event_type == "impression"
    ][:40]
    late = [msgspec.structs.replace(e, event_id=f"late-{n}") for n, e in enumerate(late)]
    archive(spark, lake, [archived(e, 10**6 + n) for n, e in enumerate(late)])
    record_arrivals(lake, late)
    hourly: dict[str, object] = {"start": at(0), "end": at(2), "granularity": "hour"}

    def per_hour(of: list[Event]) -> list[int]:
        counted = truth(of, at(0), at(2), lambda e: (
            dt.datetime.fromtimestamp(e.event_time // 3_600_000 * 3600, dt.UTC),))  # fmt: skip
        return [counted[(at(0),)], counted[(at(1),)]]

    before, after = per_hour(events), per_hour(events + late)
    assert before[1] < after[1]
    layer = layer_of(lake)
    try:
        assert hours_used(layer, **hourly) == [(at(0), at(2))]
        rows = reach_rows(layer, **hourly)
        assert [(r.source, r.reach.exact) for r in rows] == [("batch", True), ("stale", False)]
        assert [r.reach.reach for r in rows] == before
        assert rows[1].reach.high is not None
        assert rows[1].reach.high >= after[1]
    finally:
        layer.close()

    def stopped(*args: object, **kwargs: object) -> None:
        raise RuntimeError("stopped between the minute commit and the hour commit")

    monkeypatch.setattr(batch_job, "write_hours", stopped)
    with pytest.raises(RuntimeError, match="stopped"):
        run(spark, Interval(at(1), at(2)), lake=lake, definition=V1)
    monkeypatch.undo()
    layer = layer_of(lake)
    try:
        # Hour 11's minute rows are the stopped run's, its hour rows the first run's.
        assert hours_used(layer, **hourly) == [(at(0), at(1))]
        rows = reach_rows(layer, **hourly)
        assert [r.reach.reach for r in rows] == after  # the minute rows hold the late users
    finally:
        layer.close()
    # A run over both hours writes both again: hour rows for both, nothing stale.
    run(spark, Interval(at(0), at(2)), lake=lake, definition=V1)
    layer = layer_of(lake)
    try:
        assert hours_used(layer, **hourly) == [(at(0), at(2))]
        rows = reach_rows(layer, **hourly)
        assert [(r.source, r.reach.reach) for r in rows] == [("batch", n) for n in after]
    finally:
        layer.close()


def test_two_runs_numbering_users_at_once_conflict(tmp_path: Path) -> None:
    """Both number from the same dictionary version: the later commit is refused (the same
    application id), and the batch job reruns it (a conflict, as it knows one)."""
    lake = LakeSettings(lake_root=str(tmp_path / "lake"))
    path = BATCH_USERS.path(lake)
    first, second = (
        view_files.open_table(path, lake.object_store, BATCH_USERS.schema) for _ in range(2)
    )
    assert dictionary_files(first) == ([], 0)

    def users(*ids: str) -> list[dict[str, object]]:
        rows = pa.table(
            {"user_id": list(ids), "user_no": pa.array(range(1, len(ids) + 1), pa.int32())}
        )
        return write_files(BATCH_USERS.name, path, lake.object_store, rows)  # type: ignore[return-value]

    commit_users(first, users("u-a", "u-b"), version=2)  # type: ignore[arg-type]
    with pytest.raises(CommitFailedError) as refused:
        commit_users(second, users("u-c"), version=1)  # type: ignore[arg-type]
    assert is_commit_conflict(refused.value)
    reopened = view_files.open_table(path, lake.object_store, BATCH_USERS.schema)
    files, top = dictionary_files(reopened)
    assert (len(files), top) == (1, 2)


def test_a_numbering_overtaken_by_a_concurrent_run_numbers_again_on_top_of_it(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = LakeSettings(lake_root=str(tmp_path / "lake"))
    path = BATCH_USERS.path(lake)
    real_commit = users_module.commit
    overtaken: list[int] = []

    def overtaking(table: DeltaTable, files: list[DataFile], *, version: int) -> None:
        if not overtaken:
            # Another run commits its own new users first, on the same dictionary version.
            other = view_files.open_table(path, lake.object_store, BATCH_USERS.schema)
            _, top = dictionary_files(other)
            rows = pa.table({"user_id": ["u-other"], "user_no": pa.array([top + 1], pa.int32())})
            theirs = write_files(BATCH_USERS.name, path, lake.object_store, rows)
            real_commit(other, theirs, version=top + 1)
            overtaken.append(version)
        real_commit(table, files, version=version)

    monkeypatch.setattr(users_module, "commit", overtaking)
    steps: list[str] = []
    ids = spark.createDataFrame([(f"u-{n}",) for n in range(50)] + [("u-other",)], "user_id string")
    numbered = users_module.number_users(spark, lake, ids, on_step=steps.append)
    assert overtaken == [51]  # the first numbering, overtaken
    assert any("numbering again" in s for s in steps)
    assert numbered.added == 50  # u-other was numbered by the other run
    table = DeltaTable(path).to_pyarrow_table()
    assert sorted(table["user_no"].to_pylist()) == list(range(1, 52))
    assert sorted(table["user_id"].to_pylist()) == sorted(
        [f"u-{n}" for n in range(50)] + ["u-other"]
    )
    rows = {r["user_id"]: r["user_no"] for r in numbered.users.collect()}
    assert rows["u-other"] == 1
