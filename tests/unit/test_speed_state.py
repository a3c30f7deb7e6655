"""The attribution's state per Kafka partition (speed_layer.state), as pure logic on a local
directory: a worker that starts empty (a restart, another Python worker) rebuilds it from the
files, a replayed micro-batch gives the same increments, a worker behind catches up, and the
files of closed buckets are deleted and never read again."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from runtime.object_store import ObjectStoreSettings
from speed_layer import state
from tests.unit.test_speed_attribution import HOUR, Key, batch, counts, ms

QUERY = "query-1"
# The state is in a local directory here: the object store is never asked.
LOCAL = ObjectStoreSettings()


@pytest.fixture(autouse=True)
def empty_workers() -> Iterator[None]:
    state.forget()
    yield
    state.forget()


def attribute(
    root: Path, batch_id: int, events: pa.Table, *, previous: int | None, open_from: float = 0
) -> state.Attributed:
    return state.attribute(
        str(root),
        LOCAL,
        QUERY,
        0,
        batch_id,
        events,
        ms(open_from),
        previous,
        HOUR,
    )


def test_a_worker_that_starts_empty_rebuilds_the_state_from_the_files(tmp_path: Path) -> None:
    first = attribute(tmp_path, 0, batch((1, "impression", 0.5, "a")), previous=None)
    assert (first.saved, first.open_impressions, first.files_read) == (True, 1, 0)
    state.forget()  # a restart, or the partition's next batch in another Python worker
    second = attribute(tmp_path, 1, batch((1, "click", 2, "a")), previous=None)
    assert second.files_read == 1
    assert counts(second.increments) == {(0, "a"): (1, 0, 0)}  # attributed, not an orphan


def test_an_up_to_date_worker_reads_nothing(tmp_path: Path) -> None:
    attribute(tmp_path, 0, batch((1, "impression", 0.5, "a")), previous=None)
    second = attribute(tmp_path, 3, batch((1, "click", 2, "a")), previous=0)
    assert second.files_read == 0
    assert counts(second.increments) == {(0, "a"): (1, 0, 0)}


def test_a_replayed_batch_gives_the_same_increments(tmp_path: Path) -> None:
    attribute(tmp_path, 0, batch((1, "impression", 0.5, "a")), previous=None)
    clicks = batch((1, "click", 2, "a"), (1, "click", 2.5, "a"))
    once = attribute(tmp_path, 1, clicks, previous=0)
    # Spark replays batch 1 (its commit never came): the state is rebuilt as of batch 0, so the
    # first click is attributed again, not taken for a repeat of itself.
    again = attribute(tmp_path, 1, clicks, previous=0)
    assert counts(once.increments) == counts(again.increments) == {(0, "a"): (1, 0, 1)}
    assert again.files_read == 1
    assert [f.batch for f in state.state_files(str(tmp_path), LOCAL, 0)] == [0, 1]  # overwritten


def test_a_worker_behind_catches_up_on_the_batches_another_worker_did(tmp_path: Path) -> None:
    attribute(tmp_path, 0, batch((1, "impression", 0.5, "a")), previous=None)
    behind = copy.deepcopy(state._HELD)  # this worker, as of batch 0
    # Batch 1 in another worker: the impression is clicked there.
    attribute(tmp_path, 1, batch((1, "click", 1, "a")), previous=0)
    state._HELD.clear()
    state._HELD.update(behind)
    third = attribute(tmp_path, 2, batch((1, "click", 3, "a")), previous=1)
    assert third.files_read == 1  # batch 1's file, nothing older
    assert counts(third.increments) == {(0, "a"): (0, 0, 1)}  # a repeat: clicked in batch 1


def test_the_files_of_closed_buckets_are_deleted_and_never_needed(tmp_path: Path) -> None:
    attribute(tmp_path, 0, batch((1, "impression", 0.5, "a")), previous=None)
    attribute(tmp_path, 1, batch((2, "impression", 5.5, "a")), previous=0)
    assert state.expire(str(tmp_path), LOCAL, ms(5)) == 1  # minute 0 closed: batch 0's file
    assert [f.batch for f in state.state_files(str(tmp_path), LOCAL)] == [1]
    state.forget()
    later = attribute(
        tmp_path, 2, batch((2, "click", 6, "a"), (1, "click", 6, "a")), previous=None, open_from=5
    )
    assert later.open_impressions == 1
    # Impression 2 (minute 5, open) is attributed; impression 1's bucket closed: an orphan.
    assert counts(later.increments) == {(5, "a"): (1, 0, 0), (6, "a"): (0, 1, 0)}


def test_late_events_change_nothing(tmp_path: Path) -> None:
    done = attribute(tmp_path, 0, batch((1, "impression", 0.5, "a")), previous=None, open_from=3)
    assert (done.saved, done.open_impressions) == (False, 0)
    assert state.state_files(str(tmp_path), LOCAL) == []


def _stream(root: Path, batches: range, *, every: int) -> list[dict[Key, tuple[int, int, int]]]:
    """Batches of an impression each (minute 0..), every other one with a click on an earlier
    impression; snapshots every ``every`` change files. Each batch's increments."""
    found = []
    previous: int | None = None
    for b in batches:
        events = [(b, "impression", 0.5 + b * 0.01, "a")]
        if b % 2:
            events.append((b - 1, "click", 1 + b * 0.01, "a"))
        done = state.attribute(
            str(root), LOCAL, QUERY, 0, b, batch(*events), ms(0), previous, HOUR,
            snapshot_every=every,
        )  # fmt: skip
        previous = b
        found.append(counts(done.increments))
    return found


def test_a_cold_start_reads_the_newest_snapshot_and_the_change_files_after_it(
    tmp_path: Path,
) -> None:
    """Issue 67: a worker that starts empty (a driver restarted on another host) read every
    change file of the open buckets (a file per micro-batch: hundreds after ten minutes); now
    at most one snapshot and ``snapshot_every`` change files."""
    plain = _stream(tmp_path / "plain", range(10), every=10**9)
    snapped = _stream(tmp_path / "snapped", range(10), every=4)
    assert snapped == plain
    assert [s.batch for s in state.snapshots(str(tmp_path / "snapped"), LOCAL, 0)] == [3, 7]
    state.forget()
    clicks = batch((2, "click", 2, "a"), (8, "click", 2, "a"), (9, "click", 2, "a"))
    cold = attribute(tmp_path / "snapped", 10, clicks, previous=None)
    state.forget()
    without = attribute(tmp_path / "plain", 10, clicks, previous=None)
    # 9 attributed; 2 and 8 were clicked already (batches 3 and 9): repeats.
    assert counts(cold.increments) == counts(without.increments) == {(0, "a"): (1, 0, 2)}
    assert (cold.files_read, without.files_read) == (1 + 2, 10)  # snapshot 7, files 8 and 9


def test_expiry_keeps_the_two_newest_snapshots_and_what_they_do_not_hold(tmp_path: Path) -> None:
    _stream(tmp_path, range(12), every=4)  # snapshots after batches 3, 7, 11
    assert state.expire(str(tmp_path), LOCAL, ms(0)) == 1 + 8  # snapshot 3, files 0-7
    assert [s.batch for s in state.snapshots(str(tmp_path), LOCAL, 0)] == [7, 11]
    assert [f.batch for f in state.state_files(str(tmp_path), LOCAL, 0)] == [8, 9, 10, 11]
    # Spark replays batch 11 (its commit never came): rebuilt from snapshot 7 and files 8-10,
    # its increments as the first time.
    state.forget()
    again = attribute(
        tmp_path, 11, batch((11, "impression", 0.61, "a"), (10, "click", 1.11, "a")), previous=10
    )
    assert counts(again.increments) == {(0, "a"): (1, 0, 0)}
    assert again.files_read == 1 + 3
