"""SnapshotSource: when a refresh is due, ``cached()`` answers from the current snapshot at once
and re-reads the Delta logs in the background, within ``max_stale_s`` (real Delta tables; the
source's clock driven, real time still passing for its refresher thread)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lake.settings import LakeSettings
from serving_layer.snapshots import SnapshotSource
from tests.support.lake_writer import ctr_row, minute, write_speed
from tests.support.lakes import new_lake
from tests.support.waiting import wait_until

TABLES = ("speed/ctr",)


class Clock:
    """Monotonic seconds that a test moves ahead: real time plus what it skipped."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def advance(self, seconds: float) -> None:
        self.skipped += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def lake(tmp_path: Path) -> LakeSettings:
    lake = new_lake(tmp_path)
    write_speed(lake, [ctr_row(minute(0), 10, 1)])
    return lake


def wait_for_version(source: SnapshotSource, version: int) -> None:
    def current() -> bool:
        snap = source.cached()
        return snap is not None and snap["speed/ctr"].version == version

    wait_until(current, timeout_s=60, what=f"speed/ctr v{version} became current")


def test_a_due_refresh_answers_with_the_current_snapshot_and_refreshes_in_background(
    lake: LakeSettings, clock: Clock
) -> None:
    source = SnapshotSource(lake, tables=TABLES, refresh_s=0.05, max_stale_s=60, clock=clock)
    assert source.cached() is None  # nothing read yet: the caller must use current()
    first = source.current()
    assert first["speed/ctr"].version == 0
    write_speed(lake, [ctr_row(minute(1), 20, 2)])
    clock.advance(0.1)  # past refresh_s: a refresh is due

    assert source.cached() is first  # at once, without reading the log
    wait_for_version(source, 1)
    assert source.background_refreshes >= 1
    assert source.current()["speed/ctr"].version == 1


def test_without_max_stale_a_due_refresh_is_left_to_current(
    lake: LakeSettings, clock: Clock
) -> None:
    source = SnapshotSource(lake, tables=TABLES, refresh_s=0.05, clock=clock)
    source.current()
    write_speed(lake, [ctr_row(minute(1), 20, 2)])
    clock.advance(0.1)
    assert source.cached() is None
    assert source.background_refreshes == 0
    assert source.current()["speed/ctr"].version == 1


def test_a_snapshot_older_than_refresh_plus_max_stale_is_not_served(
    lake: LakeSettings, clock: Clock
) -> None:
    source = SnapshotSource(lake, tables=TABLES, refresh_s=0.05, max_stale_s=0.05, clock=clock)
    source.current()
    clock.advance(0.15)
    assert source.cached() is None


def test_negative_max_stale_is_refused(lake: LakeSettings) -> None:
    with pytest.raises(ValueError, match="'max_stale_s' must be >= 0"):
        SnapshotSource(lake, max_stale_s=-1)


def test_once_read_the_snapshot_is_kept_current_and_subscribers_hear_of_each_new_one(
    lake: LakeSettings, clock: Clock
) -> None:
    source = SnapshotSource(lake, tables=TABLES, refresh_s=0.05, max_stale_s=60, clock=clock)
    heard: list[int] = []
    source.subscribe(lambda snap: heard.append(snap["speed/ctr"].version or 0))
    source.current()
    clock.advance(0.1)
    source.cached()  # a due refresh: the background refresher starts
    try:
        write_speed(lake, [ctr_row(minute(1), 20, 2)])
        write_speed(lake, [ctr_row(minute(2), 30, 3)])
        wait_until(  # nobody calls cached() meanwhile
            lambda: 2 in heard, timeout_s=60, what=f"heard of version 2 (heard of {heard})"
        )
        assert heard == sorted(set(heard))  # each new snapshot once, in order
        assert source.cached() is not None
        assert source.cached()["speed/ctr"].version == 2  # type: ignore[index]
    finally:
        source.close()


def test_the_refresher_stops_when_nobody_reads(lake: LakeSettings, clock: Clock) -> None:
    source = SnapshotSource(lake, tables=TABLES, refresh_s=0.02, max_stale_s=60,
                            keep_current_s=0.1, clock=clock)  # fmt: skip
    source.current()
    clock.advance(0.05)
    source.cached()
    clock.advance(0.5)  # past keep_current_s without a read
    wait_until(
        lambda: not source.keeping_current, timeout_s=60, what="the refresher thread stopped"
    )
    stopped_at = source.background_refreshes
    assert stopped_at >= 1
    assert source.background_refreshes == stopped_at
    # A read, once a refresh is due, starts it again.
    clock.advance(0.05)
    source.cached()
    wait_until(
        lambda: source.background_refreshes > stopped_at,
        timeout_s=60,
        what="the refresher thread started again",
    )
    source.close()
