"""Version 3 of ``ctr`` (clicks attributed to their impressions) in the serving layer, the API,
the SQL sandbox and `ctr views diff`, over real Delta tables written by the tests (no Spark):
the batch, speed and late sides each give the five counts; version 1 keeps its answers with
raw clicks = clicks; clicks never pass impressions and the Wilson interval holds the CTR."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from typer.testing import CliRunner

from api.settings import ApiSettings
from cli.main import app
from lake.registry import record
from lake.settings import LakeSettings
from serving_layer.ctr_sql import ctr_sql
from serving_layer.diff import diff_versions
from serving_layer.inventory import Inventory
from serving_layer.query import CtrQuery
from serving_layer.reader import SnapshotReader
from serving_layer.sandbox.database import SANDBOX_VIEWS, execute, open_sandbox
from serving_layer.service import CtrRow, ServingLayer
from tests.support.api_server import running_api
from tests.support.lake_writer import (
    T0,
    attributed_row,
    cover,
    ctr_row,
    minute,
    speed_row,
    write,
    write_arrivals,
    write_batch,
    write_old_speed,
    write_speed,
)
from tests.support.lakes import new_lake
from views.columns import DIMENSIONS
from views.definitions import definition

TOKEN = "test-token-0123456789"
H = dt.timedelta(hours=1)
V1, V3 = definition("ctr", 1), definition("ctr", 3)
RANGE = {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T12:00:00Z"}
COUNTS = ("impressions", "clicks", "raw_clicks", "orphan_clicks", "repeat_clicks")


def write_v3(lake: LakeSettings, run_id: str, rows: list[dict[str, object]]) -> None:
    write(lake, "batch/ctr_v3", rows, run_id=run_id)


def build(root: Path) -> LakeSettings:
    """Both versions over the same events. Covered minutes 0 and 90 (more than the window
    apart, so a late event in one cannot change the other); speed rows at minute 0 (covered:
    not read) and minute 30 (two partial rows of one key); late arrivals at minute 90."""
    lake = new_lake(root)
    write_batch(
        lake,
        "run-1",
        [
            ctr_row(minute(0), 10, 5, campaign="c1"),
            ctr_row(minute(0), 4, 4, campaign="c2"),
            ctr_row(minute(90), 8, 2, campaign="c1"),
        ],
    )
    write_v3(
        lake,
        "run-3",
        [
            attributed_row(minute(0), 10, 3, 5, orphan_clicks=1, repeat_clicks=1, campaign="c1"),
            attributed_row(minute(0), 4, 4, 4, campaign="c2"),
            attributed_row(minute(90), 8, 2, 2, campaign="c1"),
        ],
    )
    for run_id, view in (("run-1", "ctr"), ("run-3", "ctr@v3")):
        cover(lake, run_id, minute(0), minute(1), view=view)
        cover(lake, run_id, minute(90), minute(91), view=view)
    write_speed(
        lake,
        [
            speed_row(minute(0), 99, 9, 9, campaign="c1"),
            speed_row(minute(30), 10, 12, 3, orphan_clicks=1, repeat_clicks=1, campaign="c1"),
            speed_row(minute(30), 10, 13, 3, orphan_clicks=2, repeat_clicks=1, campaign="c1"),
        ],
    )
    write_arrivals(lake, 2, [ctr_row(minute(90), 3, 2, campaign="c1")])
    return lake


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    return build(tmp_path_factory.mktemp("attribution"))


@pytest.fixture
def serving(lake: LakeSettings) -> Iterator[ServingLayer]:
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    yield layer
    layer.close()


def counts(row: CtrRow) -> tuple[object, ...]:
    return (
        row.bucket_start,
        row.impressions,
        row.clicks,
        row.raw_clicks,
        row.orphan_clicks,
        row.repeat_clicks,
        row.source,
        row.stale_events,
    )


def per_minute(serving: ServingLayer, version: int, **kwargs: Any) -> list[tuple[object, ...]]:
    query = CtrQuery.create(start=T0, end=T0 + 2 * H, granularity="minute", **kwargs)
    return [counts(r) for r in serving.ctr(query, version=version).rows]


def test_version_3_merges_batch_speed_and_late_rows(serving: ServingLayer) -> None:
    assert per_minute(serving, 3) == [
        # batch: the version's table as written
        (minute(0), 14, 7, 9, 1, 1, "batch", 0),
        # speed: attributed clicks are the clicks, the click events the raw clicks
        (minute(30), 20, 6, 25, 3, 2, "speed", 0),
        # batch plus late arrivals: a late click's impression is unknown until the recompute,
        # so it is a raw click only
        (minute(90), 11, 2, 4, 0, 0, "stale", 5),
    ]


def test_version_1_keeps_its_clicks_as_raw_clicks(serving: ServingLayer) -> None:
    assert per_minute(serving, 1) == [
        (minute(0), 14, 9, 9, None, None, "batch", 0),
        (minute(30), 20, 25, 25, None, None, "speed", 0),
        (minute(90), 11, 4, 4, None, None, "stale", 5),
    ]


def test_rolled_up_and_ordered_by_the_new_counts(serving: ServingLayer) -> None:
    query = CtrQuery.create(
        start=T0,
        end=T0 + 2 * H,
        granularity="all",
        group_by=["campaign_id"],
        order_by=["-orphan_clicks"],
    )
    rows = serving.ctr(query, version=3).rows
    assert [(r.dimensions["campaign_id"], *counts(r)[1:6]) for r in rows] == [
        ("c1", 41, 11, 34, 4, 3),
        ("c2", 4, 4, 4, 0, 0),
    ]
    assert [r.dimensions["campaign_id"] for r in serving.ctr(query, version=1).rows] == [
        "c1",
        "c2",
    ]  # null orphan counts: the order falls back to the groups


def test_an_old_speed_table_without_the_attribution_columns(tmp_path: Path) -> None:
    lake = new_lake(tmp_path)
    write_old_speed(lake, [ctr_row(minute(30), 20, 5), ctr_row(minute(31), 7, 1)])
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        assert per_minute(layer, 3) == [
            (minute(30), 20, 0, 5, 0, 0, "speed", 0),
            (minute(31), 7, 0, 1, 0, 0, "speed", 0),
        ]
        assert per_minute(layer, 1) == [
            (minute(30), 20, 5, 5, None, None, "speed", 0),
            (minute(31), 7, 1, 1, None, None, "speed", 0),
        ]
        # The per-key rows the diff and the sandbox read.
        result = diff_versions(layer.reader, V1, V3, start=T0, end=T0 + H)
        assert (result.clicks, result.raw_clicks, result.orphan_clicks) == (
            (6, 0),
            (6, 6),
            (None, 0),
        )
    finally:
        layer.close()
    with _sandbox(lake) as con:
        rows = execute(
            con,
            "SELECT clicks, raw_clicks, orphan_clicks FROM ctr_v3 ORDER BY bucket_start",
            max_rows=10,
            max_bytes=10_000,
            timeout_s=10,
        ).rows
    assert rows == [[0, 5, 0], [0, 1, 0]]


def test_a_late_click_marks_the_covered_minutes_it_may_change(tmp_path: Path) -> None:
    lake = new_lake(tmp_path)
    write_v3(lake, "run-3", [attributed_row(minute(5), 10, 2, 2)])
    cover(lake, "run-3", minute(0), minute(10), view="ctr@v3")
    # A late click at minute 8: its impression may be in any minute up to an hour before.
    write_arrivals(lake, 2, [ctr_row(minute(8), 0, 1)])
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        assert per_minute(layer, 3) == [
            (minute(5), 10, 2, 2, 0, 0, "stale", 1),
            (minute(8), 0, 0, 1, 0, 0, "stale", 1),
        ]
        # Rolled up and grouped: the one late click counts once in the row, however many of
        # its minutes it may change.
        covered = CtrQuery.create(start=T0, end=minute(10), granularity="all", group_by=["country"])
        [row] = layer.ctr(covered, version=3).rows
        assert (row.dimensions, row.clicks, row.raw_clicks, row.source, row.stale_events) == (
            {"country": "US"},
            2,
            3,
            "stale",
            1,
        )
        # Minute 5 holds a row the click may belong to; minutes 0-4 and 6-7 hold none (no
        # impression there can take it): not stale.
        assert [
            (b.bucket_start, b.events) for b in Inventory(layer.reader).stale_buckets(view=V3)
        ] == [
            (minute(5), 1),
            (minute(8), 1),
        ]
    finally:
        layer.close()


def test_late_events_of_one_campaign_mark_its_rows_only(tmp_path: Path) -> None:
    """A late click and a late impression of cmp-1 mark cmp-1's rows in the minutes they may
    change, with cmp-1's own count; cmp-2's rows in the same minutes stay exact."""
    lake = new_lake(tmp_path)
    rows = [
        attributed_row(minute(m), 100, 3, 3, campaign=campaign)
        for m in (5, 20, 40)
        for campaign in ("cmp-1", "cmp-2")
    ]
    write_v3(lake, "run-3", rows)
    cover(lake, "run-3", minute(0), minute(60), view="ctr@v3")
    # cmp-1: two late clicks in minute 30 (their impressions may be in minutes 0-29) and three
    # late impressions in minute 10 (their clicks may be in minutes 11-70).
    write_arrivals(
        lake,
        2,
        [ctr_row(minute(30), 0, 2, campaign="cmp-1"), ctr_row(minute(10), 3, 0, campaign="cmp-1")],
    )
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        minutes = per_minute(layer, 3, group_by=["campaign_id"])
        stale = {
            (r[0], campaign): r[-1] for r, campaign in zip(minutes, _campaigns(layer), strict=True)
        }
        # minute 5: the late clicks (2); minute 20: the clicks and the impressions (5); minute
        # 40: the impressions (3); minutes 10 and 30: their own arrivals only (the batch layer
        # has no row of cmp-1 there: nothing there for the other kind to change).
        assert {k: v for k, v in stale.items() if k[1] == "cmp-1"} == {
            (minute(5), "cmp-1"): 2,
            (minute(10), "cmp-1"): 3,
            (minute(20), "cmp-1"): 5,
            (minute(30), "cmp-1"): 2,
            (minute(40), "cmp-1"): 3,
        }
        assert {k: v for k, v in stale.items() if k[1] == "cmp-2"} == {
            (minute(m), "cmp-2"): 0 for m in (5, 20, 40)
        }
        total = CtrQuery.create(
            start=T0, end=minute(60), granularity="all", group_by=["campaign_id"]
        )
        by_campaign = {
            r.dimensions["campaign_id"]: (r.source, r.stale_events)
            for r in layer.ctr(total, version=3).rows
        }
        # Each late event once: 2 clicks + 3 impressions.
        assert by_campaign == {"cmp-1": ("stale", 5), "cmp-2": ("batch", 0)}
    finally:
        layer.close()


def test_an_archiver_commits_rows_of_one_key_count_once_each_way(tmp_path: Path) -> None:
    """Two tasks of one archiver commit each counted a late click of the same minute and
    dimensions (two rows, one arrival key): the row that may hold their impressions and their
    own row count 2 late events, as the archiver's rows sum, however the sources are reached."""
    lake = new_lake(tmp_path)
    write_v3(lake, "run-3", [attributed_row(minute(5), 10, 2, 2)])
    cover(lake, "run-3", minute(0), minute(60), view="ctr@v3")
    write_arrivals(lake, 2, [ctr_row(minute(30), 0, 1), ctr_row(minute(30), 0, 1)])
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    try:
        total = CtrQuery.create(start=T0, end=minute(60), granularity="all")
        [row] = layer.ctr(total, version=3).rows
        assert (row.raw_clicks, row.stale_events) == (4, 2)
        assert [r[-1] for r in per_minute(layer, 3)] == [2, 2]
    finally:
        layer.close()


def _campaigns(layer: ServingLayer) -> list[str]:
    query = CtrQuery.create(
        start=T0, end=T0 + 2 * H, granularity="minute", group_by=["campaign_id"]
    )
    return [str(r.dimensions["campaign_id"]) for r in layer.ctr(query, version=3).rows]


# -- the property: clicks <= impressions and the interval holds the CTR ----------------------

KEYS = st.tuples(st.sampled_from(["c1", "c2"]), st.sampled_from(["US", "DE", "FR"]))
MINUTES = st.integers(0, 179)


def clicked(impressions: int) -> st.SearchStrategy[int]:
    """Attributed clicks of ``impressions``: often none or all of them (the CTR at 0 or 1,
    where the interval's bounds are tightest)."""
    return st.one_of(st.just(0), st.just(impressions), st.integers(0, impressions))


@st.composite
def batch_rows(draw: st.DrawFn) -> dict[str, object]:
    impressions = draw(st.integers(0, 50))
    clicks = draw(clicked(impressions))
    campaign, country = draw(KEYS)
    return attributed_row(
        minute(draw(MINUTES)),
        impressions,
        clicks,
        draw(st.integers(0, 60)),
        orphan_clicks=draw(st.integers(0, 10)),
        repeat_clicks=draw(st.integers(0, 10)),
        campaign=campaign,
        country=country,
    )


@st.composite
def speed_rows(draw: st.DrawFn) -> dict[str, object]:
    impressions = draw(st.integers(0, 50))
    campaign, country = draw(KEYS)
    return speed_row(
        minute(draw(MINUTES)),
        impressions,
        draw(st.integers(0, 80)),  # click events: may pass impressions in a minute
        draw(clicked(impressions)),
        orphan_clicks=draw(st.integers(0, 10)),
        repeat_clicks=draw(st.integers(0, 10)),
        campaign=campaign,
        country=country,
    )


@st.composite
def arrival_rows(draw: st.DrawFn) -> dict[str, object]:
    campaign, country = draw(KEYS)
    return ctr_row(
        minute(draw(MINUTES)),
        draw(st.integers(0, 5)),
        draw(st.integers(0, 30)),
        campaign=campaign,
        country=country,
    )


@st.composite
def queries(draw: st.DrawFn) -> CtrQuery:
    start = draw(st.integers(0, 170))
    end = draw(st.integers(start + 1, 240))
    group_by = draw(st.lists(st.sampled_from(["campaign_id", "country"]), unique=True))
    # A filter on one dimension, with values of either (a campaign's value as a country is
    # refused: not two upper-case letters).
    dimension = draw(st.sampled_from(["campaign_id", "country", None]))
    values = ["c1", "c2", "US"] if dimension == "campaign_id" else ["US", "DE", "FR", "GB"]
    filters = (
        {}
        if dimension is None
        else {dimension: draw(st.lists(st.sampled_from(values), min_size=1, max_size=2))}
    )
    return CtrQuery.create(
        start=minute(start),
        end=minute(end),
        granularity=draw(st.sampled_from(["minute", "hour", "day", "all"])),
        group_by=group_by,
        filters=filters,
    )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batch=st.lists(batch_rows(), max_size=12),
    speed=st.lists(speed_rows(), max_size=12),
    arrivals=st.lists(arrival_rows(), max_size=4),
    covered=st.tuples(st.integers(0, 120), st.integers(1, 60)),
    asked=st.lists(queries(), min_size=1, max_size=6),
)
def test_attributed_clicks_never_pass_impressions(
    batch: list[dict[str, object]],
    speed: list[dict[str, object]],
    arrivals: list[dict[str, object]],
    covered: tuple[int, int],
    asked: list[CtrQuery],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        lake = LakeSettings(lake_root=Path(root) / "lake", checkpoint_root=Path(root) / "ck")
        if batch:
            write_v3(lake, "run-3", batch)
        cover(lake, "run-3", minute(covered[0]), minute(sum(covered)), view="ctr@v3")
        if speed:
            write_speed(lake, speed)
        if arrivals:
            write_arrivals(lake, 2, arrivals)
        record(lake, "ctr", 3, "published", "attribution")
        layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
        try:
            for query in asked:
                result = layer.ctr(query)
                assert result.view == V3
                for row in result.rows:
                    assert 0 <= row.clicks <= row.impressions, row
                    assert row.raw_clicks >= 0
                    assert row.orphan_clicks is not None
                    assert row.repeat_clicks is not None
                    if row.impressions == 0:
                        assert (row.ctr, row.ctr_ci_low, row.ctr_ci_high) == (None, None, None)
                    else:
                        assert row.ctr is not None
                        assert row.ctr_ci_low is not None
                        assert row.ctr_ci_high is not None
                        assert 0 <= row.ctr_ci_low <= row.ctr <= row.ctr_ci_high <= 1, row
        finally:
            layer.close()


# -- the API: JSON and CSV, version=3 and as_of ----------------------------------------------


@pytest.fixture(scope="module")
def client(lake: LakeSettings) -> Iterator[httpx.Client]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with (
        running_api(settings, lake) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        yield client


def test_the_api_answers_the_new_counts_in_json_and_csv(client: httpx.Client) -> None:
    params = {**RANGE, "granularity": "all", "group_by": "campaign_id", "version": "3"}
    body = client.get("/api/v1/ctr", params=params).json()
    assert body["view"] == {"name": "ctr", "version": 3}
    assert [[r["campaign_id"], *(r[c] for c in COUNTS)] for r in body["rows"]] == [
        ["c1", 41, 11, 34, 4, 3],
        ["c2", 4, 4, 4, 0, 0],
    ]
    for row in body["rows"]:
        assert row["ctr_ci_low"] <= row["ctr"] == row["clicks"] / row["impressions"]
        assert row["ctr"] <= row["ctr_ci_high"] <= 1

    answer = client.get("/api/v1/ctr", params={**params, "format": "csv"})
    assert answer.headers["ctr-view"] == "ctr@3"
    header, *lines = csv.reader(io.StringIO(answer.text, newline=""))
    assert header[:7] == ["bucket_start", "campaign_id", *COUNTS]
    assert [line[1:7] for line in lines] == [
        ["c1", "41", "11", "34", "4", "3"],
        ["c2", "4", "4", "4", "0", "0"],
    ]

    ordered = client.get(
        "/api/v1/ctr", params={**params, "order_by": "-repeat_clicks,raw_clicks"}
    ).json()
    assert [r["campaign_id"] for r in ordered["rows"]] == ["c1", "c2"]
    assert ordered["query"]["order_by"] == ["-repeat_clicks", "raw_clicks"]


def test_the_published_version_1_answers_null_attribution_counts(client: httpx.Client) -> None:
    params = {**RANGE, "granularity": "all", "group_by": "campaign_id"}
    body = client.get("/api/v1/ctr", params=params).json()
    assert body["view"]["version"] == 1
    assert [[r["campaign_id"], *(r[c] for c in COUNTS)] for r in body["rows"]] == [
        ["c1", 41, 34, 34, None, None],
        ["c2", 4, 4, 4, None, None],
    ]
    _, *lines = csv.reader(
        io.StringIO(client.get("/api/v1/ctr", params={**params, "format": "csv"}).text)
    )
    assert [line[2:7] for line in lines] == [["41", "34", "34", "", ""], ["4", "4", "4", "", ""]]


def test_version_3_as_of_a_moment(client: httpx.Client) -> None:
    now = dt.datetime.now(dt.UTC).isoformat()
    params = {**RANGE, "granularity": "all", "version": "3", "as_of": now}
    [row] = client.get("/api/v1/ctr", params=params).json()["rows"]
    assert [row[c] for c in COUNTS] == [45, 15, 38, 4, 3]


def test_order_by_names_the_new_counts_when_refused(client: httpx.Client) -> None:
    answer = client.get("/api/v1/ctr", params={**RANGE, "order_by": "orphans"})
    assert answer.status_code == 400
    assert "raw_clicks, orphan_clicks, repeat_clicks" in answer.json()["detail"]


def test_openapi_describes_the_new_fields(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["CtrRowBody"]
    fields = schema["properties"]
    assert "clicked at least once" in fields["clicks"]["description"]
    assert "every valid click event" in fields["raw_clicks"]["description"]
    assert "no impression within the window" in fields["orphan_clicks"]["description"]
    assert "after its first click" in fields["repeat_clicks"]["description"]
    assert {"raw_clicks", "orphan_clicks", "repeat_clicks"} <= set(schema["required"])


# -- the SQL sandbox ---------------------------------------------------------------------------


@contextlib.contextmanager
def _sandbox(lake: LakeSettings) -> Iterator[duckdb.DuckDBPyConnection]:
    """The SQL sandbox's database over the lake's current snapshot."""
    layer = ServingLayer(SnapshotReader(lake, refresh_s=0))
    snap = layer.reader.snapshot()
    con = open_sandbox(
        {view: snap[name] for view, name in SANDBOX_VIEWS.items()},
        lake.object_store,
        memory_limit_bytes=256 * 2**20,
    )
    try:
        yield con
    finally:
        con.close()
        layer.close()


def test_the_sandbox_views_have_the_counts_per_version(lake: LakeSettings) -> None:
    def total(con: duckdb.DuckDBPyConnection, view: str) -> list[Any]:
        sql = f"SELECT {', '.join(f'sum({c})' for c in COUNTS)} FROM {view}"
        return execute(con, sql, max_rows=1, max_bytes=10_000, timeout_s=10).rows[0]

    with _sandbox(lake) as con:
        assert total(con, "ctr_v3") == [45, 15, 38, 4, 3]
        assert total(con, "ctr_v1") == [45, 38, 38, None, None]
        assert total(con, "ctr") == total(con, "ctr_v1")  # the published one
        # speed_v3: speed/ctr's rows as version 3 counts them
        assert total(con, "speed_v3") == [119, 15, 34, 3, 2]
        assert total(con, "stale_v3")[:3] == [3, 0, 2]


# -- the diff of version 1 and version 3 -------------------------------------------------------


def test_the_diff_of_version_1_and_3(lake: LakeSettings, serving: ServingLayer) -> None:
    result = diff_versions(serving.reader, V1, V3, start=T0, end=T0 + 2 * H)
    assert (result.rows_compared, result.rows_changed) == (4, 3)
    assert (result.only_in_a, result.only_in_b) == (0, 0)
    assert result.impressions == (45, 45)
    assert result.clicks == (38, 15)  # attributed: fewer
    assert result.raw_clicks == (38, 38)  # the same click events
    assert (result.orphan_clicks, result.repeat_clicks) == ((None, 4), (None, 3))
    assert [
        (c.bucket_start, c.dimensions["campaign_id"], c.clicks, c.raw_clicks, c.orphan_clicks)
        for c in result.largest
    ] == [
        (minute(30), "c1", (25, 6), (25, 25), (None, 3)),
        (minute(0), "c1", (5, 3), (5, 5), (None, 1)),
        (minute(90), "c1", (4, 2), (4, 4), (None, 0)),
    ]
    summary = result.summary()
    assert {k: summary[k] for k in COUNTS} == {
        "impressions": {"a": 45, "b": 45},
        "clicks": {"a": 38, "b": 15},
        "raw_clicks": {"a": 38, "b": 38},
        "orphan_clicks": {"a": None, "b": 4},
        "repeat_clicks": {"a": None, "b": 3},
    }

    env = {
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "COLUMNS": "200",
    }
    runner = CliRunner()
    shown = runner.invoke(app, ["views", "diff", "ctr", "1", "3"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "impressions 45 -> 45 (+0); clicks 38 -> 15 (-23); raw clicks 38 -> 38 (+0)" in (
        shown.output
    )
    assert "orphan clicks n/a -> 4; repeat clicks n/a -> 3" in shown.output
    raw = runner.invoke(app, ["views", "diff", "ctr", "1", "3", "--json"], env=env)
    assert json.loads(raw.stdout)["orphan_clicks"] == {"a": None, "b": 4}
    same = runner.invoke(app, ["views", "diff", "ctr", "1", "2"], env=env)
    assert "orphan clicks" not in same.output


def test_dimensions_are_the_views() -> None:
    assert DIMENSIONS[0] == "campaign_id"  # the tests above group on it by name


def test_ctr_sql_reads_the_sides_of_any_version(serving: ServingLayer) -> None:
    """What a caller of ctr_sql outside the service (the serving benchmark) passes it."""
    snap = serving.reader.snapshot()
    query = CtrQuery.create(start=T0, end=minute(60), granularity="all")
    for view, expected in ((V1, (34, 34, 34, None, None)), (V3, (34, 13, 34, 4, 3))):
        sql, params = ctr_sql(
            query,
            **serving.reader.sides(snap, view),
            covered="unused",
            intervals=serving.reader.coverage(snap, view).within(query.start, query.end),
        )
        with serving.reader.cursor() as cur:
            [row] = cur.execute(sql, params).fetchall()
        assert row[1:6] == expected
