"""Reach and frequency: exact from the batch layer where it covers a bucket, a sketch estimate
elsewhere, against the ground truth of generated traffic with known users.

Real Spark (the batch job over master/events on disk), real Delta tables, the serving layer's
DuckDB. The speed layer's rows are written with its own view function (:func:`views.ctr.ctr_arrow`,
which ``tests/integration/test_speed.py`` holds equal to the job's)."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pydantic import SecretStr
from pyspark.sql import SparkSession

from access.roles import Access, Scope
from api.settings import ApiSettings
from batch_layer.interval import Interval
from batch_layer.job import run
from events.model import Event
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.catalog import BATCH_USERS, SPEED_CTR
from lake.settings import LakeSettings
from serving_layer.query import CtrQuery
from serving_layer.reach import NOT_MEASURED, Reach, ReachFound, reach_of
from serving_layer.reader import SnapshotReader
from serving_layer.sandbox.database import SqlError
from serving_layer.sandbox.pool import SqlPool
from serving_layer.service import CtrRow, ServingLayer
from speed_layer.tables import SpeedTable
from tests.support.api_server import running_api
from tests.support.events import archive, archived
from views import sketches
from views.columns import DIMENSIONS
from views.ctr import ctr_arrow
from views.definitions import definition

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
# Three standard errors of a unioned sketch, relative, as the tolerance; and one user
# more for the rounding of small counts.
TOLERANCE = 3 * sketches.RELATIVE_ERROR


def at(hours: float) -> dt.datetime:
    return T0 + hours * HOUR


@pytest.fixture(scope="module")
def traffic() -> list[Event]:
    """About three hours of events from 4,000 users (most seen several times an hour),
    deduplicated by event id; the generator's duplicates and late events are in
    master/events."""
    config = TrafficConfig(
        seed=31,
        start_ms=int(T0.timestamp() * 1000),
        events_per_second=1.5,
        campaigns=3,
        ads_per_campaign=3,
        sites=5,
        users=4_000,
        duplicate_fraction=0.02,
        late_fraction=0.02,
        late_delay_s=(60.0, 1800.0),
    )
    records = zip(range(16_000), TrafficGenerator(config), strict=False)
    return [record.event for _, record in records if record.event is not None]


@pytest.fixture(scope="module")
def served(
    spark: SparkSession, traffic: list[Event], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServingLayer, list[Event]]]:
    """A lake whose batch layer (versions 1 and 3) covers hours 0 and 1 and whose speed layer
    holds hours 1 (covered: not served) and 2 on."""
    lake = LakeSettings(lake_root=str(tmp_path_factory.mktemp("reach") / "lake"))
    archive(spark, lake, [archived(e, offset) for offset, e in enumerate(traffic)])
    for version in (1, 3):
        for n in (0, 1):
            run(spark, Interval(at(n), at(n + 1)), lake=lake, definition=definition("ctr", version))
    distinct = list({e.event_id: e for e in reversed(traffic)}.values())
    speed = [e for e in distinct if e.event_time >= at(1).timestamp() * 1000]
    write_speed_rows(lake, speed)
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    yield layer, distinct
    layer.close()


def write_speed_rows(lake: LakeSettings, events: list[Event]) -> None:
    """``events`` counted as the speed job counts a micro-batch, appended to speed/ctr."""
    table = pa.table(
        {
            "event_time": pa.array(
                [dt.datetime.fromtimestamp(e.event_time / 1000, dt.UTC) for e in events],
                pa.timestamp("us", tz="UTC"),
            ),
            "event_type": [e.event_type for e in events],
            **{d: [getattr(e, d) for e in events] for d in DIMENSIONS},
            "user_id": [e.user_id for e in events],
        }
    )
    view = ctr_arrow(table, reach=True)
    zeros = pa.array([0] * view.num_rows, pa.int64())
    for name in ("attributed_clicks", "orphan_clicks", "repeat_clicks"):
        view = view.append_column(name, zeros)
    view = view.append_column(
        "updated_at", pa.array([dt.datetime.now(dt.UTC)] * view.num_rows, pa.timestamp("us", "UTC"))
    )
    speed = SpeedTable(
        SPEED_CTR.path(lake), lake.object_store, SPEED_CTR.schema, retention_hours=24
    )
    assert speed.append(view, app_id="test-reach", version=0)


def truth(
    events: Iterable[Event],
    start: dt.datetime,
    end: dt.datetime,
    key: Callable[[Event], tuple[object, ...]],
    kind: str = "impression",
) -> dict[tuple[object, ...], int]:
    """Distinct users with an event of ``kind`` in [start, end), per ``key``."""
    users: dict[tuple[object, ...], set[str]] = defaultdict(set)
    lo, hi = start.timestamp() * 1000, end.timestamp() * 1000
    for e in events:
        if lo <= e.event_time < hi and e.event_type == kind:
            users[key(e)].add(e.user_id)
    return {k: len(v) for k, v in users.items()}


def hour_of(e: Event) -> dt.datetime:
    return dt.datetime.fromtimestamp(e.event_time // 3_600_000 * 3600, dt.UTC)


def query(layer: ServingLayer, version: int | None = None, **params: object) -> list[CtrRow]:
    return layer.ctr(CtrQuery.create(**params, reach=True), version=version).rows  # type: ignore[arg-type]


def within_error(row: CtrRow, expected: int) -> bool:
    reach = row.reach
    assert reach.reach is not None
    assert reach.low is not None
    assert reach.high is not None
    return bool(abs(reach.reach - expected) <= TOLERANCE * expected + 1)


@pytest.mark.parametrize("version", [1, 3])
def test_covered_hours_are_exact_under_any_grouping_and_filter(
    served: tuple[ServingLayer, list[Event]], version: int
) -> None:
    layer, events = served
    rows = query(layer, version, start=at(0), end=at(2), granularity="hour")
    expected = truth(events, at(0), at(2), lambda e: (hour_of(e),))
    assert [((r.bucket_start,), r.reach.reach) for r in rows] == sorted(expected.items())
    clicking = truth(events, at(0), at(2), lambda e: (hour_of(e),), kind="click")
    assert [r.reach.clicking_users for r in rows] == [clicking[(r.bucket_start,)] for r in rows]
    for row in rows:
        assert row.source == "batch"
        assert row.reach.exact
        assert row.reach.low == row.reach.reach == row.reach.high
        assert row.reach.reach is not None
        assert row.reach.frequency == pytest.approx(row.impressions / row.reach.reach)
        assert row.impressions > row.reach.reach  # users seen several times

    countries = sorted({e.country for e in events})[:2]
    grouped = query(
        layer,
        version,
        start=at(0),
        end=at(2),
        granularity="all",
        group_by=["campaign_id", "device_type"],
        filters={"country": countries},
    )
    expected = truth(
        (e for e in events if e.country in countries),
        at(0),
        at(2),
        lambda e: (e.campaign_id, e.device_type),
    )
    got = {(r.dimensions["campaign_id"], r.dimensions["device_type"]): r for r in grouped}
    assert {k: r.reach.reach for k, r in got.items()} == expected
    assert all(r.reach.exact for r in grouped)
    # Unique users do not add up across groups: the total is less than the sum.
    per_campaign = query(
        layer, version, start=at(0), end=at(2), granularity="all", group_by=["campaign_id"]
    )
    total = query(layer, version, start=at(0), end=at(2), granularity="all")[0]
    assert total.reach.reach == len(
        {
            e.user_id
            for e in events
            if e.event_type == "impression"
            and at(0).timestamp() * 1000 <= e.event_time < at(2).timestamp() * 1000
        }
    )
    assert total.reach.reach < sum(r.reach.reach for r in per_campaign)  # type: ignore[misc]


def test_speed_buckets_and_the_batch_speed_boundary_are_estimated_within_the_error(
    served: tuple[ServingLayer, list[Event]],
) -> None:
    layer, events = served
    end = at(3)
    # Hour 2: speed rows only.
    speed_hour = [
        r for r in query(layer, start=at(0), end=end, granularity="hour") if r.bucket_start == at(2)
    ]
    assert [r.source for r in speed_hour] == ["speed"]
    assert not speed_hour[0].reach.exact
    assert within_error(speed_hour[0], truth(events, at(2), end, lambda e: ())[()])
    # Across the boundary: half an hour of batch rows, an hour of speed rows, per campaign.
    across = query(layer, start=at(1.5), end=end, granularity="all", group_by=["campaign_id"])
    expected = truth(events, at(1.5), end, lambda e: (e.campaign_id,))
    assert {r.dimensions["campaign_id"] for r in across} == {k[0] for k in expected}
    for row in across:
        assert row.source == "mixed"
        assert not row.reach.exact
        assert within_error(row, expected[(row.dimensions["campaign_id"],)])
        assert row.reach.low <= row.reach.reach <= row.reach.high  # type: ignore[operator]
    # One minute to a day: minutes of the speed hour, per ad.
    minutes = query(layer, start=at(2), end=at(2.25), granularity="minute", group_by=["ad_id"])
    per_minute = truth(
        events,
        at(2),
        at(2.25),
        lambda e: (dt.datetime.fromtimestamp(e.event_time // 60_000 * 60, dt.UTC), e.ad_id),
    )
    assert len(minutes) > 50
    for row in minutes:
        expected_users = per_minute.get((row.bucket_start, row.dimensions["ad_id"]), 0)
        assert within_error(row, expected_users)
    day = query(layer, start=T0 - 12 * HOUR, end=T0 + 12 * HOUR, granularity="day")
    assert len(day) == 1
    assert day[0].source == "mixed"
    assert within_error(day[0], truth(events, at(0), at(12), lambda e: ())[()])


def test_a_covered_part_of_an_hour_is_exact_and_a_speed_part_estimated(
    served: tuple[ServingLayer, list[Event]],
) -> None:
    """The rule is the provenance's: the minutes of the range in the bucket, all covered
    (exact, even a part of an hour: the batch rows list their users per minute) or not."""
    layer, events = served
    rows = query(layer, start=at(1.75), end=at(2.5), granularity="hour")
    assert [(r.source, r.reach.exact) for r in rows] == [("batch", True), ("speed", False)]
    assert rows[0].reach.reach == truth(events, at(1.75), at(2), lambda e: ())[()]
    assert within_error(rows[1], truth(events, at(2), at(2.5), lambda e: ())[()])


def test_rows_written_before_reach_was_measured_have_none() -> None:
    # A batch row without lists and sketches among the bucket's rows: not measured.
    found = ReachFound(0, 0, False, [], [], 3)
    assert reach_of(found, "batch", 10, 0) == NOT_MEASURED
    assert reach_of(found, "speed", 10, 0) == NOT_MEASURED


def test_a_stale_bucket_is_bounded_by_its_late_events() -> None:
    found = ReachFound(40, 5, True, [], [], 0)
    assert reach_of(found, "stale", 100, 3) == Reach(40, 40, 43, False, 5, 2.5)
    assert reach_of(found, "batch", 100, 0) == Reach(40, 40, 40, True, 5, 2.5)
    # Late events in a covered bucket without batch rows: no users counted, up to one each.
    assert reach_of(None, "stale", 2, 2) == Reach(0, 0, 2, False, 0, None)


def test_the_sql_sandbox_unions_the_sketches_and_hides_user_ids_from_analysts(
    served: tuple[ServingLayer, list[Event]],
) -> None:
    layer, events = served
    snapshot = layer.reader.snapshot()
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=1.0)
    try:
        # The merged view's sketches (batch rows where covered, speed rows elsewhere), unioned
        # per campaign: the API's estimate for the same range.
        sql = (
            "SELECT campaign_id, sketch_estimate(sketch_union(list(reach_sketch))) AS reach "
            "FROM ctr WHERE bucket_start >= TIMESTAMPTZ '2026-11-22 11:30:00+00' "
            "AND bucket_start < TIMESTAMPTZ '2026-11-22 13:00:00+00' GROUP BY ALL ORDER BY 1"
        )
        estimated = {c: r for c, r in pool.run(sql, snapshot).rows}
        api = query(layer, start=at(1.5), end=at(3), granularity="all", group_by=["campaign_id"])
        assert {c: round(float(r)) for c, r in estimated.items()} == {  # type: ignore[arg-type]
            r.dimensions["campaign_id"]: r.reach.reach for r in api
        }
        # The exact lists (of the users' numbers): an admin's; an analyst's database has no
        # user-level data at all.
        exact = "SELECT count(DISTINCT u) FROM (SELECT unnest(user_nos) AS u FROM ctr_batch)"
        covered = truth(events, at(0), at(2), lambda e: ())[()]
        assert pool.run(exact, snapshot).rows == [[covered]]
        analyst = Access("team", "analyst")
        with pytest.raises(SqlError, match="user_nos"):
            pool.run(exact, snapshot, access=analyst)
        described = [r[0] for r in pool.run("DESCRIBE ctr_batch", snapshot, access=analyst).rows]
        assert "reach_sketch" in described
        assert not {"users", "clickers", "user_nos", "clicker_nos"} & set(described)
    finally:
        pool.close()


def test_the_api_answers_reach_when_asked_in_json_and_csv(
    served: tuple[ServingLayer, list[Event]],
) -> None:
    layer, events = served
    token = "reach-token-0123456789"
    settings = ApiSettings(token=SecretStr(token), refresh_s=0, cache_stale_s=0)
    params = {
        "start": at(0).isoformat(),
        "end": at(3).isoformat(),
        "granularity": "hour",
        "group_by": "campaign_id",
    }
    with (
        running_api(settings, layer.reader.lake) as url,
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client,
    ):
        plain = client.get("/api/v1/ctr", params=params).json()["rows"]
        assert plain
        assert "reach" not in plain[0]  # not asked for: not computed
        rows = client.get("/api/v1/ctr", params={**params, "reach": "true"}).json()["rows"]
        expected = truth(events, at(0), at(3), lambda e: (hour_of(e), e.campaign_id))
        for row in rows:
            key = (dt.datetime.fromisoformat(row["bucket_start"]), row["campaign_id"])
            assert row["reach_exact"] == (row["source"] == "batch")
            if row["reach_exact"]:
                assert row["reach"] == expected[key]
                assert row["reach_low"] == row["reach"] == row["reach_high"]
            else:
                assert abs(row["reach"] - expected[key]) <= TOLERANCE * expected[key] + 1
                assert row["reach_low"] <= row["reach"] <= row["reach_high"]
            assert row["frequency"] == pytest.approx(row["impressions"] / row["reach"], rel=0.03)
        assert {r["reach_exact"] for r in rows} == {True, False}
        answer = client.get("/api/v1/ctr", params={**params, "reach": "true", "format": "csv"})
        header, *lines = list(csv.reader(io.StringIO(answer.text, newline="")))
        assert header[-6:] == [
            "reach",
            "reach_low",
            "reach_high",
            "reach_exact",
            "frequency",
            "clicking_users",
        ]
        assert [line[-6:-2] for line in lines] == [
            [
                str(r["reach"]),
                str(r["reach_low"]),
                str(r["reach_high"]),
                str(r["reach_exact"]).lower(),
            ]
            for r in rows
        ]
        bad = client.get("/api/v1/ctr", params={**params, "reach": "maybe"})
        assert bad.status_code == 400
        assert "reach" in bad.text


# -- issue 55: no user-level data below admin --------------------------------------------------


def coupon(user_id: str) -> bytes:
    """The 4 bytes a sketch in its small modes holds for ``user_id``: what an attacker computes
    for every id of a guessed id space (the hash is public: DataSketches' MurmurHash3)."""
    one = sketches.sketch([user_id])
    return one[8:12]  # LIST mode: an 8-byte preamble, then the coupons


def blob_of(cell: object) -> bytes:
    """A BLOB as the sandbox's JSON gives it: UTF-8 text, else base64 marked ``base64:``."""
    assert isinstance(cell, str)
    if cell.startswith("base64:"):
        return base64.b64decode(cell.removeprefix("base64:"))
    return cell.encode()


def recovered(blob: bytes, dictionary: dict[bytes, str]) -> set[str]:
    """The dictionary attack of issue 55: read a sketch's coupons (LIST and SET modes keep
    4-byte coupons at 4-byte offsets after their 8- or 12-byte preamble) and look them up.
    Bytes that are no HLL sketch (DataSketches' preamble: serial version 1, family 7) hold no
    coupon to read."""
    if len(blob) < 8 or blob[1] != 1 or blob[2] != 7:
        return set()
    words = {blob[i : i + 4] for i in range(8, len(blob) - 3, 4)}
    return {dictionary[w] for w in words if w in dictionary}


@pytest.fixture(scope="module")
def dictionary() -> dict[bytes, str]:
    """Coupons of the traffic's whole id space and as many ids more (the probe guessed
    user-0000000…user-0199999)."""
    return {coupon(f"user-{n:07d}"): f"user-{n:07d}" for n in range(8_000)}


SKETCH_PROBES = (
    "SELECT reach_sketch, clicker_sketch FROM ctr_batch_v3",
    "SELECT reach_sketch, clicker_sketch FROM ctr_speed",
    "SELECT reach_sketch, clicker_sketch FROM ctr",
    "SELECT reach_sketch, clicker_sketch FROM speed_v3",
    "SELECT reach_sketch, clicker_sketch FROM ctr_v1",
    "SELECT sketch_union(list(reach_sketch)), sketch_union(list(clicker_sketch)) FROM ctr_v3 "
    "GROUP BY campaign_id",
)


def test_the_dictionary_attack_recovers_every_user_of_an_admins_sketches(
    served: tuple[ServingLayer, list[Event]], dictionary: dict[bytes, str]
) -> None:
    """The attack works (so the test below can fail): an admin's raw sketch of a small row
    gives back exactly the row's users."""
    layer, _ = served
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=1.0)
    try:
        rows = pool.run(
            "SELECT reach_sketch, user_nos FROM ctr_batch_v3 WHERE len(user_nos) BETWEEN 2 AND 40 "
            "ORDER BY bucket_start, campaign_id, ad_id, site_id, country, device_type LIMIT 5",
            layer.reader.snapshot(),
        ).rows
    finally:
        pool.close()
    numbered = DeltaTable(BATCH_USERS.path(layer.reader.lake)).to_pyarrow_table()
    names = dict(zip(numbered["user_no"].to_pylist(), numbered["user_id"].to_pylist(), strict=True))
    assert len(rows) == 5
    for blob, numbers in rows:
        assert isinstance(numbers, list)
        assert recovered(blob_of(blob), dictionary) == {names[n] for n in numbers}


@pytest.mark.parametrize(
    "access",
    [Access("team", "analyst"), Access("acme", "advertiser", Scope.create(["cmp-001"]))],
    ids=["analyst", "advertiser"],
)
def test_sketches_below_admin_are_sealed_and_give_up_no_user(
    served: tuple[ServingLayer, list[Event]], dictionary: dict[bytes, str], access: Access
) -> None:
    layer, _ = served
    snapshot = layer.reader.snapshot()
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=512 * 2**20, grace_s=1.0)
    try:
        blobs = [
            blob_of(cell)
            for sql in SKETCH_PROBES
            for row in pool.run(sql, snapshot, access=access).rows
            for cell in row
            if isinstance(cell, str)
        ]
        assert len(blobs) > 100
        assert all(recovered(blob, dictionary) == set() for blob in blobs)
        assert all(blob.startswith(sketches.SketchSeal.MAGIC) for blob in blobs)
        # No stable pseudonyms either: the same row's sketch reads differently every time.
        again = "SELECT reach_sketch FROM ctr_batch_v3 ORDER BY ALL LIMIT 3"
        first, second = (pool.run(again, snapshot, access=access).rows for _ in range(2))
        assert [r[0] for r in first] != [r[0] for r in second]
        # A sketch the reader made (of guessed ids, to test membership by union) is refused.
        forged = sketches.sketch(["user-0000001"]).hex()
        for probe in (
            f"SELECT sketch_estimate(from_hex('{forged}'))",
            "SELECT sketch_estimate(sketch_union(list(reach_sketch) || "
            f"[from_hex('{forged}')])) FROM ctr_batch_v3",
        ):
            with pytest.raises(SqlError, match="not a sketch of this query's views"):
                pool.run(probe, snapshot, access=access)
        # Sealed sketches still union, server-side, to the admin's estimate.
        reach = (
            "SELECT campaign_id, round(sketch_estimate(sketch_union(list(reach_sketch)))) "
            "FROM ctr GROUP BY ALL ORDER BY ALL"
        )
        sealed = pool.run(reach, snapshot, access=access).rows
        raw = pool.run(reach, snapshot).rows
        assert sealed
        assert sealed == [r for r in raw if access.scope is None or r[0] == "cmp-001"]
    finally:
        pool.close()
