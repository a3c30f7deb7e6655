"""SQL over rewritten files (issues 55 and 66): whatever Arrow type a Delta writer records for
a string or a binary, every view reads and filters it.

delta-rs's ``DELETE`` records ``string_view`` and ``binary_view`` in the files it rewrites (the
platform's own clean-ups of master/arrivals among them), other writers append view or large
types, Spark records ``string``. Arrow's compute has no kernels for the view types, and the
SQL sandbox reads the lake through Arrow's scanner: every filter that reached Arrow failed on
such a file, those of the query's WHERE and those DuckDB pushes while the query runs (a
join's keys: the merged views are joins), which issue 55's LIMIT barrier did not stop
("'array_filter' has no kernel matching input types (string_view, bool)" on ``ctr`` and
``stale``, for every key). Here every table the sandbox reads gets two files, and the lake is
rewritten by delta-rs (its compaction, then a delete: the demo's sequence; or the delete
alone), by Spark, or appended in view and large types; every view each role may read is then
queried with string filters, joins and top-N, through the pool (the roles at once) and through
``/api/v1/sql`` (the keys at once), against the same rows never rewritten; and the demo's
sequence again on the local S3 server."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, TypeVar

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pydantic import SecretStr
from pyspark.sql import SparkSession

from access.key_store import create_key
from access.roles import Access, Scope
from api.settings import ApiSettings
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from lake.catalog import SERVED
from lake.settings import LakeSettings
from lake.storage import delta_options, open_delta
from runtime.object_store import ObjectStoreSettings
from serving_layer.sandbox.pool import SqlPool
from serving_layer.snapshots import SCHEMAS, LakeSnapshot, SnapshotSource
from tests.support.api_server import running_api
from tests.support.lake_writer import (
    T0,
    attributed_row,
    ctr_row,
    event,
    minute,
    reached,
    rejected,
    speed_row,
)
from tests.support.lakes import new_lake

TOKEN = "rewritten-token-0123456789"
_T = TypeVar("_T")
# Each view a role may read: its columns and their DuckDB types.
Views = dict[str, dict[str, str]]
ROLES: Final[dict[str, Access | None]] = {
    "admin": None,
    "analyst": Access("team", "analyst"),
    "advertiser": Access("acme", "advertiser", Scope.create(["cmp-1"])),
}
# A junk row per table (deleted again by the rewrites) holds "junk" in this column, so that a
# DELETE rewrites a file that keeps rows.
JUNK_COLUMN: Final = {
    "batch/ctr_reach": "value",
    "batch/ctr_v2_reach": "value",
    "batch/ctr_v3_reach": "value",
    "batch/coverage": "run_id",
    "batch/drift": "run_id",
    "views/registry": "view",
    "master/rejected": "reason",
}
WRITERS = (
    "delta-rs OPTIMIZE, DELETE",
    "delta-rs DELETE",
    "Spark DELETE",
    "view and large types appended",
)


def _reach(row: dict[str, object], *users: str) -> dict[str, object]:
    return reached(row, users, users[:1])


def _hour_row(campaign: str) -> dict[str, object]:
    row = _reach(ctr_row(T0, 30, 3, campaign=campaign), "u1", "u2")
    return {**row, "run_id": "run-a", "user_bitmap": b"\x01\x02", "clicker_bitmap": b"\x01"}


def _cube_row(campaign: str) -> dict[str, object]:
    return {
        "bucket_start": T0,
        "dimension": "campaign_id",
        "value": campaign,
        "run_id": "run-a",
        "user_bitmap": b"\x01\x02",
        "clicker_bitmap": b"\x01",
    }


def _arrival(at: dt.datetime, campaign: str, version: int) -> dict[str, object]:
    return {
        **ctr_row(at, 3, 1, campaign=campaign),
        "events_version": version,
        "batch_id": version,
        "archived_at": T0 + dt.timedelta(hours=6),
    }


def _covered(run_id: str, view: str) -> dict[str, object]:
    return {
        "run_id": run_id,
        "view": view,
        "interval_start": minute(0),
        "interval_end": minute(2),
        "input_version": 1,
        "rows_written": 2,
        "finished_at": minute(30),
    }


def _drift(run_id: str, view: str) -> dict[str, object]:
    return {
        "run_id": run_id,
        "view": view,
        "bucket_start": minute(0),
        "speed_impressions": 11,
        "speed_clicks": 1,
        "batch_impressions": 10,
        "batch_clicks": 1,
        "recorded_at": minute(30),
    }


def _registry(version: int, event_: str, hours: int) -> dict[str, object]:
    at = T0 + dt.timedelta(hours=hours)
    return {"view": "ctr", "version": version, "event": event_, "reason": "test", "at": at}


def _attributed(at: dt.datetime, campaign: str, run_id: str) -> dict[str, object]:
    row = attributed_row(at, 10, 1, 2, orphan_clicks=1, campaign=campaign)
    return {**_reach(row, "u1", "u3"), "run_id": run_id}


def _batch(at: dt.datetime, campaign: str, run_id: str) -> dict[str, object]:
    return {**_reach(ctr_row(at, 10, 1, campaign=campaign), "u1", "u3"), "run_id": run_id}


def _speed(at: dt.datetime, campaign: str) -> dict[str, object]:
    return {**_reach(speed_row(at, 7, 2, 1, campaign=campaign), "u2"), "updated_at": T0}


# Two commits per table the sandbox reads, every string and binary column with a value.
COMMITS: Final[dict[str, tuple[list[dict[str, object]], list[dict[str, object]]]]] = {
    "batch/ctr": (
        [_batch(minute(0), "cmp-1", "run-a")],
        [_batch(minute(1), "cmp-2", "run-a")],
    ),
    "batch/ctr_v2": (
        [_batch(minute(0), "cmp-1", "run-v2")],
        [_batch(minute(1), "cmp-2", "run-v2")],
    ),
    "batch/ctr_v3": (
        [_attributed(minute(0), "cmp-1", "run-v3")],
        [_attributed(minute(1), "cmp-2", "run-v3")],
    ),
    "batch/ctr_hours": ([_hour_row("cmp-1")], [_hour_row("cmp-2")]),
    "batch/ctr_v2_hours": ([_hour_row("cmp-1")], [_hour_row("cmp-2")]),
    "batch/ctr_v3_hours": ([_hour_row("cmp-1")], [_hour_row("cmp-2")]),
    "batch/ctr_reach": ([_cube_row("cmp-1")], [_cube_row("cmp-2")]),
    "batch/ctr_v2_reach": ([_cube_row("cmp-1")], [_cube_row("cmp-2")]),
    "batch/ctr_v3_reach": ([_cube_row("cmp-1")], [_cube_row("cmp-2")]),
    "batch/coverage": (
        [_covered("run-a", "ctr"), _covered("run-v2", "ctr@v2")],
        [_covered("run-v3", "ctr@v3")],
    ),
    "batch/drift": ([_drift("run-a", "ctr")], [_drift("run-v3", "ctr@v3")]),
    "speed/ctr": ([_speed(minute(1), "cmp-1")], [_speed(minute(2), "cmp-2")]),
    # Late events in covered minutes (a newer master/events version than the runs read): stale.
    "master/arrivals": (
        [_arrival(minute(0), "cmp-1", 5)],
        [_arrival(minute(1), "cmp-2", 6)],
    ),
    "master/events": ([event(0)], [{**event(1), "campaign_id": "cmp-2"}]),
    "master/rejected": ([rejected(5)], [rejected(6, "record: not an object")]),
    # Version 3 published: ctr, stale and covered are version 3's.
    "views/registry": ([_registry(3, "ready", 0)], [_registry(3, "published", 1)]),
}


def _recorded(kind: pa.DataType, recorded: str) -> pa.DataType:
    """``kind`` as a writer that records Arrow's ``view`` or ``large`` types writes it."""
    if pa.types.is_string(kind):
        return pa.string_view() if recorded == "view" else pa.large_string()
    if pa.types.is_binary(kind):
        return pa.binary_view() if recorded == "view" else pa.large_binary()
    if pa.types.is_list(kind):
        item = _recorded(kind.value_type, recorded)
        return pa.list_(item) if recorded == "view" else pa.large_list(item)
    return kind


def append(lake: LakeSettings, table: str, rows: list[dict[str, object]], recorded: str) -> None:
    """One commit of ``rows``, its strings and binaries as Arrow ``recorded`` them (``plain``,
    ``view``, ``large``)."""
    schema = SCHEMAS[table]
    data = pa.Table.from_pylist(rows, schema=schema)
    if recorded != "plain":
        data = data.cast(pa.schema([f.with_type(_recorded(f.type, recorded)) for f in schema]))
    path = lake.table(table)
    write_deltalake(
        path,
        data,
        mode="append",
        partition_by=["event_date"] if table == "master/events" else None,
        storage_options=delta_options(path, lake.object_store),
    )


def build(
    lake: LakeSettings, *, junk: bool, recorded: Sequence[str] = ("plain", "plain")
) -> LakeSettings:
    """Every table the sandbox reads, in two commits (written as ``recorded`` says); with
    ``junk``, the first also holds a row of "junk", for the rewrites to delete."""
    for table, (first, second) in COMMITS.items():
        extra = [{**first[0], JUNK_COLUMN.get(table, "campaign_id"): "junk"}] if junk else []
        append(lake, table, [*first, *extra], recorded[0])
        append(lake, table, second, recorded[1])
    return lake


def rewrite(lake: LakeSettings, writer: str, spark: SparkSession | None = None) -> None:
    """Every table rewritten by ``writer``: its junk rows deleted (after a compaction)."""

    def table_rewritten(table: str) -> None:
        path = lake.table(table)
        junk = f"{JUNK_COLUMN.get(table, 'campaign_id')} = 'junk'"
        if writer == "Spark DELETE":
            assert spark is not None
            spark.sql(f"DELETE FROM delta.`{path}` WHERE {junk}")
            return
        if writer == "delta-rs OPTIMIZE, DELETE":
            open_delta(path, lake.object_store).optimize.compact()
        open_delta(path, lake.object_store).delete(junk)

    # The tables side by side: a Spark statement takes seconds here, mostly its driver's.
    with ThreadPoolExecutor(max_workers=4) as threads:
        list(threads.map(table_rewritten, COMMITS))


@pytest.fixture(scope="module")
def lakes(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LakeSettings]:
    """A lake per writer, and the reference: the same rows, never rewritten."""
    root = tmp_path_factory.mktemp("rewritten")
    built = {"reference": build(new_lake(root / "reference"), junk=False)}
    for n, writer in enumerate(WRITERS):
        lake = new_lake(root / str(n))
        if writer == "view and large types appended":
            built[writer] = build(lake, junk=False, recorded=("view", "large"))
        else:
            built[writer] = build(lake, junk=True)
            rewrite(lake, writer, spark)
    return built


@pytest.fixture(scope="module")
def pool() -> Iterator[SqlPool]:
    pool = SqlPool(workers=2, queue_size=8, memory_bytes=512 * 2**20, grace_s=1.0)
    yield pool
    pool.close()


def _string_types(lake: LakeSettings, table: str) -> set[str]:
    return {
        str(pq.read_schema(f).field(JUNK_COLUMN.get(table, "campaign_id")).type)
        for f in DeltaTable(lake.table(table)).file_uris()
    }


def test_the_writers_record_what_the_test_needs(lakes: dict[str, LakeSettings]) -> None:
    """The premise: every table rewritten (its junk rows gone), its files of every recorded
    type."""
    for table in COMMITS:
        column = JUNK_COLUMN.get(table, "campaign_id")
        for writer, lake in lakes.items():
            values = DeltaTable(lake.table(table)).to_pyarrow_table(columns=[column])
            assert "junk" not in values.column(0).to_pylist(), (writer, table)
        types = {writer: _string_types(lake, table) for writer, lake in lakes.items()}
        assert types["reference"] == types["Spark DELETE"] == {"string"}, table
        assert types["delta-rs DELETE"] == {"string", "string_view"}, table
        assert types["delta-rs OPTIMIZE, DELETE"] == {"string_view"}, table
        assert types["view and large types appended"] == {"string_view", "large_string"}, table
    assert {t.name for t in SERVED} == set(COMMITS)


def columns_of(pool: SqlPool, snapshot: LakeSnapshot, access: Access | None) -> Views:
    """Each view ``access`` may read: its columns and their types."""
    rows = pool.run("SHOW ALL TABLES", snapshot, access=access).rows
    views: Views = {}
    for _, _, name, names, types, _ in rows:
        assert isinstance(names, list)
        assert isinstance(types, list)
        views[str(name)] = dict(zip(map(str, names), map(str, types), strict=True))
    return views


def _where(view: str, columns: dict[str, str]) -> str:
    """String filters on ``view``: constants DuckDB hands to Arrow's scanner, and a semi-join
    whose keys it pushes there while the query runs."""
    if "campaign_id" in columns:
        return (
            "campaign_id = 'cmp-1' OR (campaign_id IN ('cmp-2', 'x') AND campaign_id >= 'cmp' "
            "AND campaign_id LIKE 'cmp%' AND campaign_id IN (SELECT campaign_id FROM "
            f"{view} WHERE campaign_id LIKE 'cmp-%'))"
        )
    strings = [c for c, kind in columns.items() if kind == "VARCHAR"]
    blobs = [c for c, kind in columns.items() if kind == "BLOB" and not c.endswith("sketch")]
    filters = [f"{c} >= ''" for c in strings[:2]] + [f"{c} > ''::BLOB" for c in blobs[:1]]
    if strings:
        c = strings[0]
        filters.append(f"{c} IN (SELECT {c} FROM {view} WHERE {c} LIKE '%')")
    return " AND ".join(filters) or "true"


# What the probe asked (every key got "'array_filter' has no kernel matching input types
# (string_view, bool)"), and top-N and joins over the merged views, whose joins' keys DuckDB
# pushes into the scans as the query runs.
QUERIES: Final = {
    "ctr of cmp-1": (
        "SELECT COLUMNS(c -> c NOT LIKE '%sketch') FROM ctr WHERE campaign_id = 'cmp-1' "
        "ORDER BY ALL"
    ),
    "stale of cmp": "SELECT * FROM stale WHERE campaign_id LIKE 'cmp%' ORDER BY ALL",
    "ctr top": (
        "SELECT campaign_id, impressions FROM ctr ORDER BY impressions DESC, campaign_id LIMIT 1"
    ),
    "stale top": "SELECT bucket_start, campaign_id FROM stale ORDER BY ALL DESC LIMIT 1",
    "ctr joined": (
        "SELECT c.campaign_id, c.bucket_start, s.stale_events FROM ctr c "
        "JOIN stale s USING (bucket_start, campaign_id) WHERE c.campaign_id LIKE 'cmp%' "
        "ORDER BY ALL"
    ),
}


def every_view_sql(views: Views) -> str:
    """One query reading every view of ``views`` through its string filters (sealed sketches,
    which read differently every time, left out): a row per view, its rows as JSON."""
    parts = [
        f"SELECT '{view}' AS view, to_json(list(r ORDER BY r)) AS rows FROM (SELECT "
        f"COLUMNS(c -> c NOT LIKE '%sketch') FROM {view} WHERE {_where(view, columns)}) r"
        for view, columns in views.items()
    ]
    return " UNION ALL ".join(parts) + " ORDER BY view"


@dataclass(frozen=True)
class Expected:
    """A role's queries and their answers over the lake never rewritten."""

    queries: dict[str, str]
    answers: dict[str, list[list[object]]]


@pytest.fixture(scope="module")
def expected(lakes: dict[str, LakeSettings], pool: SqlPool) -> dict[str, Expected]:
    snapshot = SnapshotSource(lakes["reference"], refresh_s=0).current()
    out = {}
    for role, access in ROLES.items():
        queries = {**QUERIES, "every view": every_view_sql(columns_of(pool, snapshot, access))}
        answers = {
            name: pool.run(sql, snapshot, access=access).rows for name, sql in queries.items()
        }
        out[role] = Expected(queries, answers)
    return out


def test_the_reference_answers_have_rows_in_every_view(expected: dict[str, Expected]) -> None:
    """The answers compared hold rows, every view's, and an advertiser's are its campaign's."""
    for role, asked in expected.items():
        empty = [name for name, rows in asked.answers.items() if not rows]
        empty += [str(view) for view, rows in asked.answers["every view"] if rows is None]
        assert empty == [], role
    assert "cmp-2" not in str(expected["advertiser"].answers)
    assert "cmp-2" in str(expected["analyst"].answers["ctr joined"])


def _at_once(calls: Sequence[Callable[[], _T]]) -> list[_T]:
    with ThreadPoolExecutor(max_workers=len(calls)) as threads:
        return list(threads.map(lambda call: call(), calls))


@pytest.mark.parametrize("writer", WRITERS)
def test_every_view_filters_rewritten_files_for_every_role_at_once(
    lakes: dict[str, LakeSettings], pool: SqlPool, expected: dict[str, Expected], writer: str
) -> None:
    rewritten = SnapshotSource(lakes[writer], refresh_s=0).current()

    def ask(role: str) -> Callable[[], dict[str, list[list[object]]]]:
        def call() -> dict[str, list[list[object]]]:
            queries = expected[role].queries.items()
            return {
                name: pool.run(sql, rewritten, access=ROLES[role]).rows for name, sql in queries
            }

        return call

    answers = _at_once([ask(role) for role in ROLES])
    for role, answer in zip(ROLES, answers, strict=True):
        assert answer == expected[role].answers, role


@pytest.mark.parametrize("writer", WRITERS)
def test_every_route_answers_over_rewritten_tables_at_once(
    lakes: dict[str, LakeSettings], expected: dict[str, Expected], writer: str
) -> None:
    """Through the API, the three keys at once: the same queries, and the CTR route."""
    lake = lakes[writer]
    keys = {
        "admin": TOKEN,
        "analyst": create_key(lake, "team", "analyst")[1],
        "advertiser": create_key(lake, "acme", "advertiser", campaigns=["cmp-1"])[1],
    }
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, key_use_flush_s=3600)
    end = minute(0) + dt.timedelta(hours=1)
    window = {"start": minute(0).isoformat(), "end": end.isoformat(), "granularity": "minute"}
    with running_api(settings, lake) as url:

        def ask(role: str) -> Callable[[], tuple[dict[str, object], httpx.Response]]:
            def call() -> tuple[dict[str, object], httpx.Response]:
                headers = {"Authorization": f"Bearer {keys[role]}"}
                with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                    answers = {}
                    for name, sql in expected[role].queries.items():
                        reply = client.post("/api/v1/sql", json={"sql": sql})
                        answers[name] = reply.json()["rows"] if reply.is_success else reply.text
                    ctr = client.get("/api/v1/ctr", params={**window, "campaign_id": "cmp-1"})
                    return answers, ctr

            return call

        replies = _at_once([ask(role) for role in ROLES])
    for role, (answers, ctr) in zip(ROLES, replies, strict=True):
        assert answers == expected[role].answers, role
        assert ctr.status_code == 200, (role, ctr.text)
        # Minute 0 covered by version 3 (published), its stale arrivals added (minute 1:
        # covered, no row of cmp-1; minute 2: speed's, no row of cmp-1).
        assert [r["impressions"] for r in ctr.json()["rows"]] == [10 + 3], role


@pytest.fixture(scope="module")
def s3_lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeSettings]:
    """The lake on the local S3 server, compacted and cleaned up by delta-rs."""
    run_dir = tmp_path_factory.mktemp("s3-run")
    s3 = LocalS3(LocalS3Settings(run_dir=run_dir, port=free_base_port(), bucket="rewritten"))
    assert s3.start()
    try:
        lake = LakeSettings(
            lake_root="s3://rewritten/lake",
            checkpoint_root=run_dir / "checkpoints",
            object_store=ObjectStoreSettings.model_validate(s3.environment()),
        )
        build(lake, junk=True)
        rewrite(lake, "delta-rs OPTIMIZE, DELETE")
        yield lake
    finally:
        s3.stop(discard=True)


def test_every_view_filters_files_delta_rs_rewrote_on_s3(
    s3_lake: LakeSettings, pool: SqlPool, expected: dict[str, Expected]
) -> None:
    """The same reading on an object store: the workers open the files through Arrow's S3
    filesystem, with no footer read ahead."""
    rewritten = SnapshotSource(s3_lake, refresh_s=0).current()
    assert rewritten["master/arrivals"].files[0].startswith("s3://")
    for role, access in ROLES.items():
        queries = expected[role].queries.items()
        answers = {name: pool.run(sql, rewritten, access=access).rows for name, sql in queries}
        assert answers == expected[role].answers, role
