"""A table's file list patched from its log's new commits (serving_layer.log_tail) is the list
delta-rs reads whole, version after version: appends, an overwrite (every file removed), a
compaction, partition values that need escaping; a schema change asks for a reload. And the
snapshot source built on it looks at each table as often as it changes, counts its requests,
and catches up to versions a client has already seen (real Delta tables on a local disk)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lake.settings import LakeSettings
from runtime.object_store import ObjectStoreSettings
from serving_layer.delta_log import log_of
from serving_layer.log_tail import NeedsReload, follow
from serving_layer.snapshots import BehindError, SnapshotSource, key_covers
from tests.support.lake_writer import ctr_row, minute, write_speed
from tests.support.lakes import new_lake


def rows(*values: str) -> pa.Table:
    return pa.table({"part": list(values), "n": list(range(len(values)))})


def files_read_whole(path: Path) -> tuple[str, ...]:
    return tuple(sorted(DeltaTable(str(path)).file_uris()))


def compact(path: Path) -> None:
    DeltaTable(str(path)).optimize.compact()


def test_the_patched_list_is_the_list_delta_rs_reads_at_every_version(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), rows("a b/c", "x%y", "é"), partition_by=["part"])
    log = log_of(path, ObjectStoreSettings())
    version, files = 0, files_read_whole(path)
    changes: list[Callable[[], object]] = [
        lambda: write_deltalake(
            str(path), rows("a b/c", "z"), partition_by=["part"], mode="append"
        ),
        lambda: write_deltalake(str(path), rows("q"), partition_by=["part"], mode="append"),
        lambda: compact(path),
        lambda: write_deltalake(str(path), rows("w"), partition_by=["part"], mode="overwrite"),
        lambda: write_deltalake(str(path), rows("é"), partition_by=["part"], mode="append"),
    ]
    for change in changes:
        change()
        tail = follow(log, str(path), version, files)
        assert tail.version == DeltaTable(str(path)).version()
        assert tail.files == files_read_whole(path)
        assert tail.requests == tail.version - version + 1  # each new commit, then "not there"
        version, files = tail.version, tail.files
    # Several commits at once: one tail follows them all.
    for letter in "mno":
        write_deltalake(str(path), rows(letter), partition_by=["part"], mode="append")
    tail = follow(log, str(path), version, files)
    assert (tail.version, tail.files) == (version + 3, files_read_whole(path))


def test_nothing_new_costs_one_request_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), rows("a"), partition_by=["part"])
    files = files_read_whole(path)
    tail = follow(log_of(path, ObjectStoreSettings()), str(path), 0, files)
    assert (tail.version, tail.files, tail.requests) == (0, files, 1)


def test_a_schema_change_or_too_many_commits_asks_for_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), rows("a"), partition_by=["part"])
    files = files_read_whole(path)
    log = log_of(path, ObjectStoreSettings())
    write_deltalake(str(path), rows("b"), partition_by=["part"], mode="append")
    with pytest.raises(NeedsReload, match="more than 0 new commits"):
        follow(log, str(path), 0, files, limit=0)
    wider = rows("c").append_column("extra", pa.array([1]))
    write_deltalake(str(path), wider, partition_by=["part"], mode="append", schema_mode="merge")
    with pytest.raises(NeedsReload, match="metaData"):
        follow(log, str(path), 0, files)


class Clock:
    """Monotonic seconds a test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lake(tmp_path: Path) -> LakeSettings:
    lake = new_lake(tmp_path)
    write_speed(lake, [ctr_row(minute(0), 10, 1)])
    return lake


def test_the_speed_table_is_looked_at_every_refresh_and_the_others_seldom(
    lake: LakeSettings,
) -> None:
    clock = Clock()
    source = SnapshotSource(
        lake, tables=("speed/ctr", "batch/ctr"), refresh_s=1, seldom_s=10, clock=clock
    )
    first = source.current()
    assert (source.interval_s("speed/ctr"), source.interval_s("batch/ctr")) == (1, 10)
    assert source.requests == {"reload": 1, "exists": 2, "status": 1}
    for _ in range(9):
        clock.now += 1
        assert source.current().key == first.key
    # Nine refreshes: speed/ctr's next commit looked for each time, batch/ctr not yet.
    assert source.requests["commit"] == 9
    assert source.requests["exists"] == 2
    assert source.requests["status"] == 10
    clock.now += 1
    source.current()
    assert source.requests["exists"] == 3  # batch/ctr, ten seconds on
    write_speed(lake, [ctr_row(minute(1), 20, 2)])
    clock.now += 1
    assert source.current()["speed/ctr"].version == 1
    assert source.requests["reload"] == 1  # patched from the commit, not read again


def test_refresh_zero_looks_at_every_table_on_every_call(lake: LakeSettings) -> None:
    source = SnapshotSource(lake, tables=("speed/ctr", "batch/ctr"), refresh_s=0, seldom_s=10)
    assert source.interval_s("batch/ctr") == 0
    source.current()
    source.current()
    # Both tables twice: speed/ctr read, then its next commit looked for; batch/ctr looked for.
    assert (source.requests["exists"], source.requests["commit"]) == (3, 1)


def test_a_client_ahead_of_this_process_makes_it_catch_up(lake: LakeSettings) -> None:
    clock = Clock()
    source = SnapshotSource(lake, tables=("speed/ctr",), refresh_s=60, clock=clock)
    assert source.current()["speed/ctr"].version == 0
    write_speed(lake, [ctr_row(minute(1), 20, 2)])  # another replica reads version 1
    assert source.current()["speed/ctr"].version == 0  # not due for a minute
    clock.now += 1
    caught_up = source.at_least({"speed/ctr": 1, "not/served": 7})
    assert caught_up["speed/ctr"].version == 1
    assert source.current() is caught_up
    assert key_covers(caught_up.key, {"speed/ctr": 1})
    assert not key_covers(caught_up.key, {"speed/ctr": 2})
    # A version nobody committed: refused, and asking again at once does not read the log.
    with pytest.raises(BehindError, match="speed/ctr 5"):
        source.at_least({"speed/ctr": 5})
    looked = source.requests["commit"]
    with pytest.raises(BehindError):
        source.at_least({"speed/ctr": 5})
    assert source.requests["commit"] == looked
    clock.now += 1
    with pytest.raises(BehindError):
        source.at_least({"speed/ctr": 5})
    assert source.requests["commit"] == looked + 1
