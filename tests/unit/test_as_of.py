"""As-of queries: the lake as it was at a moment (``SnapshotSource.at``), GET /api/v1/ctr and
POST /api/v1/sql with ``as_of`` answering exactly what they answered then, and the errors for a
moment before the lake, in the future, or whose versions retention removed (real Delta tables
written with delta-rs, the real API under uvicorn)."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pydantic import SecretStr

from api.settings import ApiSettings
from lake.settings import LakeSettings
from serving_layer.delta_log import commit_ns, log_of
from serving_layer.snapshots import SCHEMAS, AsOfError, SnapshotSource
from tests.support.api_server import running_api
from tests.support.lake_writer import cover, ctr_row, minute, write_batch, write_speed
from tests.support.lakes import new_lake

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUERY = {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T12:00:00Z", "granularity": "minute"}
COUNTS = (
    "SELECT (SELECT count(*) FROM ctr_batch), (SELECT count(*) FROM ctr_speed), "
    "(SELECT count(*) FROM coverage)"
)


class Commits:
    """Commit times given, not waited for: a Delta commit's time is its log entry's
    modification time (:mod:`serving_layer.delta_log`), so each new entry is stamped a second
    after the last, from an hour ago on; :meth:`moment` is a time after every stamped commit and
    before the next."""

    def __init__(self, lake: LakeSettings) -> None:
        self.lake = lake
        self.root = Path(str(lake.lake_root))
        self.at = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
        self.stamped: set[Path] = set()

    def stamp(self) -> None:
        for entry in sorted(self.root.glob("**/_delta_log/*.json")):
            if entry not in self.stamped:
                self.at += dt.timedelta(seconds=1)
                ns = (self.at - EPOCH) // dt.timedelta(microseconds=1) * 1000
                os.utime(entry, ns=(ns, ns))
                self.stamped.add(entry)

    def moment(self) -> dt.datetime:
        self.stamp()
        self.at += dt.timedelta(seconds=1)
        return self.at


EPOCH = dt.datetime.fromtimestamp(0, dt.UTC)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def rerun_batch(
    lake: LakeSettings,
    run_id: str,
    start: dt.datetime,
    end: dt.datetime,
    rows: Sequence[dict[str, object]],
) -> None:
    """A batch run as the batch layer commits it: replace the interval's rows, record coverage."""
    data = pa.Table.from_pylist([{**r, "run_id": run_id} for r in rows], SCHEMAS["batch/ctr"])
    write_deltalake(
        lake.table("batch/ctr"),
        data,
        mode="overwrite",
        predicate=f"bucket_start >= '{iso(start)}' AND bucket_start < '{iso(end)}'",
    )
    cover(lake, run_id, start, end)


@pytest.fixture
def commits(tmp_path: Path) -> Commits:
    return Commits(new_lake(tmp_path))


@pytest.fixture
def lake(commits: Commits) -> LakeSettings:
    """run-a covers 10:00-10:30; speed rows at 10:02 (covered) and 10:40; each commit a second
    after the one before."""
    lake = commits.lake
    write_batch(lake, "run-a", [ctr_row(minute(1), 100, 10), ctr_row(minute(2), 50, 5)])
    commits.stamp()
    cover(lake, "run-a", minute(0), minute(30))
    commits.stamp()
    write_speed(lake, [ctr_row(minute(2), 999, 99), ctr_row(minute(40), 7, 1)])
    commits.stamp()
    return lake


def change(lake: LakeSettings) -> None:
    """run-b recomputes 10:00-11:00 (10:02 changes, 10:40 becomes exact); a speed row at 11:10."""
    rerun_batch(
        lake,
        "run-b",
        minute(0),
        minute(60),
        [ctr_row(minute(1), 100, 10), ctr_row(minute(2), 60, 6), ctr_row(minute(40), 8, 1)],
    )
    write_speed(lake, [ctr_row(minute(70), 5, 0)])


def serve(lake: LakeSettings, *, cache_stale_s: float = 0) -> Iterator[httpx.Client]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=cache_stale_s)
    with (
        running_api(settings, lake) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=30) as client,
    ):
        yield client


@pytest.fixture
def client(lake: LakeSettings) -> Iterator[httpx.Client]:
    yield from serve(lake)


def ctr(client: httpx.Client, **params: str) -> httpx.Response:
    response = client.get("/api/v1/ctr", params={**QUERY, **params})
    assert response.status_code == 200, response.text
    return response


def summary(response: httpx.Response) -> list[tuple[object, ...]]:
    return [
        (r["bucket_start"][11:16], r["impressions"], r["source"], r["run_ids"])
        for r in response.json()["rows"]
    ]


def sql_counts(client: httpx.Client, **body: str) -> list[object]:
    response = client.post("/api/v1/sql", json={"sql": COUNTS, **body})
    assert response.status_code == 200, response.text
    rows: list[list[object]] = response.json()["rows"]
    return rows[0]


def error(response: httpx.Response) -> tuple[int, str | None, str]:
    body = response.json()
    return response.status_code, body.get("parameter"), body["detail"]


# -- GET /api/v1/ctr ------------------------------------------------------------------------------


def test_as_of_answers_what_the_api_answered_then(
    client: httpx.Client, lake: LakeSettings, commits: Commits
) -> None:
    before = ctr(client)
    then = commits.moment()
    change(lake)
    commits.stamp()
    after = ctr(client)
    assert summary(before) == [
        ("10:01", 100, "batch", ["run-a"]),
        ("10:02", 50, "batch", ["run-a"]),
        ("10:40", 7, "speed", []),
    ]
    assert summary(after) == [
        ("10:01", 100, "batch", ["run-b"]),
        ("10:02", 60, "batch", ["run-b"]),
        ("10:40", 8, "batch", ["run-b"]),
        ("11:10", 5, "speed", []),
    ]

    as_of_then = ctr(client, as_of=iso(then))
    assert as_of_then.json()["freshness"]["versions"] == before.json()["freshness"]["versions"]
    assert as_of_then.content == before.content
    assert ctr(client, as_of=iso(now())).content == after.content
    assert ctr(client).content == after.content  # the current snapshot stays current


def test_end_defaults_to_as_of(client: httpx.Client) -> None:
    moment = iso(now())
    params = {"start": QUERY["start"], "granularity": "minute", "as_of": moment}
    default_end = client.get("/api/v1/ctr", params=params)
    assert default_end.status_code == 200, default_end.text
    assert default_end.content == ctr(client, as_of=moment, end=moment).content


def test_an_as_of_answer_is_never_a_cached_answer_of_another_snapshot(
    lake: LakeSettings, commits: Commits
) -> None:
    then = commits.moment()
    change(lake)
    commits.stamp()
    # Within cache_stale_s, the response cache serves an entry of an older snapshot while it
    # recomputes: never to an as-of request, and never an as-of entry to a current request.
    for client in serve(lake, cache_stale_s=60):
        current = ctr(client)
        old = ctr(client, as_of=iso(then))
        assert summary(old)[1] == ("10:02", 50, "batch", ["run-a"])
        assert ctr(client).content == current.content
        assert ctr(client, as_of=iso(then)).content == old.content


@pytest.mark.parametrize(
    ("as_of", "message"),
    [
        ("2020-01-01T00:00:00Z", r"as_of: 2020-01-01T00:00:00Z is before the lake's first commit "),
        ("2020-01-01T00:00:00", r"as_of: 2020-01-01T00:00:00Z is before the lake's first commit "),
        ("2999-01-01T00:00:00+02:00", r"as_of: 2998-12-31T22:00:00Z is in the future"),
        ("yesterday", r"as_of: Input should be a valid datetime"),
    ],
)
def test_bad_moments_are_400s_naming_as_of(client: httpx.Client, as_of: str, message: str) -> None:
    status, parameter, detail = error(client.get("/api/v1/ctr", params={**QUERY, "as_of": as_of}))
    assert (status, parameter) == (400, "as_of")
    assert re.match(message, detail), detail


def test_a_vacuumed_version_is_a_400_saying_so_and_from_when_the_table_can_be_read(
    client: httpx.Client, lake: LakeSettings, commits: Commits
) -> None:
    then = commits.moment()
    change(lake)
    commits.stamp()
    assert summary(ctr(client, as_of=iso(then)))[1] == ("10:02", 50, "batch", ["run-a"])
    DeltaTable(lake.table("batch/ctr")).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    rerun_at = commit_ns(log_of(lake.table("batch/ctr"), lake.object_store), 1)
    assert rerun_at is not None

    status, parameter, detail = error(
        client.get("/api/v1/ctr", params={**QUERY, "as_of": iso(then)})
    )
    assert (status, parameter) == (400, "as_of")
    match = re.fullmatch(
        rf"as_of: batch/ctr version 0, its version at {re.escape(iso(then))}, cannot be read: "
        r"its data files were vacuumed \(retention\); batch/ctr can be read as of (\S+) or later",
        detail,
    )
    assert match, detail
    readable_from = dt.datetime.fromisoformat(match.group(1))
    assert readable_from == dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(
        microseconds=-(-rerun_at // 1000)
    )
    assert summary(ctr(client, as_of=match.group(1)))[1] == ("10:02", 60, "batch", ["run-b"])

    status, parameter, _ = error(
        client.post("/api/v1/sql", json={"sql": "SELECT 1", "as_of": iso(then)})
    )
    assert (status, parameter) == (400, "as_of")


# -- POST /api/v1/sql -----------------------------------------------------------------------------


def test_sql_as_of_reads_the_versions_of_then(
    client: httpx.Client, lake: LakeSettings, commits: Commits
) -> None:
    then = commits.moment()
    change(lake)
    commits.stamp()
    assert sql_counts(client) == [3, 3, 2]
    assert sql_counts(client, as_of=iso(then)) == [2, 2, 1]


def test_sql_as_of_before_the_lake_is_a_400_naming_as_of(client: httpx.Client) -> None:
    response = client.post("/api/v1/sql", json={"sql": COUNTS, "as_of": "2020-01-01T00:00:00Z"})
    status, parameter, detail = error(response)
    assert (status, parameter) == (400, "as_of")
    assert detail.startswith("as_of: 2020-01-01T00:00:00Z is before the lake's first commit ("), (
        detail
    )


# -- SnapshotSource.at ----------------------------------------------------------------------------


def log(lake: LakeSettings, table: str) -> Path:
    return Path(lake.table(table)) / "_delta_log"


def committed(lake: LakeSettings, table: str, version: int) -> dt.datetime:
    """The commit time of ``version``, rounded up to the microsecond."""
    ns = commit_ns(log_of(lake.table(table), lake.object_store), version)
    assert ns is not None
    return dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(microseconds=-(-ns // 1000))


def test_at_picks_the_last_version_committed_at_or_before_the_moment(
    lake: LakeSettings, commits: Commits
) -> None:
    for n in range(3):
        write_speed(lake, [ctr_row(minute(50 + n), 1, 0)])
        commits.stamp()
    source = SnapshotSource(lake, tables=("speed/ctr", "master/events"))
    tick = dt.timedelta(microseconds=1)
    for version in range(4):
        at_commit = committed(lake, "speed/ctr", version)
        # master/events was never committed: it does not exist at any moment.
        assert source.at(at_commit).versions() == {"speed/ctr": version, "master/events": None}
        if version:
            assert source.at(at_commit - tick)["speed/ctr"].version == version - 1
    with pytest.raises(AsOfError, match=r"is before the lake's first commit \("):
        source.at(committed(lake, "speed/ctr", 0) - tick)


def test_a_table_first_committed_after_the_moment_did_not_exist_yet(lake: LakeSettings) -> None:
    source = SnapshotSource(lake, tables=("batch/ctr", "batch/coverage", "speed/ctr"))
    snapshot = source.at(committed(lake, "batch/ctr", 0))
    assert snapshot.versions() == {"batch/ctr": 0, "batch/coverage": None, "speed/ctr": None}
    assert snapshot["speed/ctr"].files == ()
    assert snapshot.status is None


def test_at_never_replaces_the_current_snapshot(lake: LakeSettings, commits: Commits) -> None:
    source = SnapshotSource(lake, refresh_s=60)
    current = source.current()
    change(lake)
    commits.stamp()
    assert source.at(now())["batch/ctr"].version == 1
    assert source.current() is current


def test_a_cleaned_up_log_is_an_as_of_error(lake: LakeSettings, commits: Commits) -> None:
    then = commits.moment()
    change(lake)
    commits.stamp()
    # What log cleanup leaves: a checkpoint of the latest version, the older commits gone.
    DeltaTable(lake.table("batch/ctr")).create_checkpoint()
    os.remove(log(lake, "batch/ctr") / f"{0:020d}.json")
    with pytest.raises(
        AsOfError,
        match=rf"^batch/ctr cannot be read as of {re.escape(iso(then))}: its log was cleaned up "
        rf"\(retention\); batch/ctr can be read as of "
        rf"{re.escape(iso(committed(lake, 'batch/ctr', 1)))} or later$",
    ):
        SnapshotSource(lake).at(then)


def test_at_needs_a_timezone(lake: LakeSettings) -> None:
    with pytest.raises(ValueError, match="'moment' must be timezone-aware"):
        SnapshotSource(lake).at(dt.datetime(2026, 11, 22, 10))
