"""Maintenance on real Delta tables: pruning speed rows the batch layer covers, compaction."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from batch_layer.maintenance import compact_and_vacuum, covered_intervals, prune_speed
from infra.lake import LakeSettings

T = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)


def hours(n: float) -> dt.datetime:
    return T + dt.timedelta(hours=n)


def coverage(lake: LakeSettings, spans: list[tuple[float, float]]) -> None:
    write_deltalake(lake.table("batch/coverage"), pa.table({
        "run_id": [f"r{i}" for i in range(len(spans))],
        "view": ["ctr"] * len(spans),
        "interval_start": pa.array([hours(a) for a, _ in spans], pa.timestamp("us", "UTC")),
        "interval_end": pa.array([hours(b) for _, b in spans], pa.timestamp("us", "UTC")),
    }))  # fmt: skip


def test_covered_intervals_merge_overlaps_and_keep_gaps(lake: LakeSettings) -> None:
    assert covered_intervals(lake) == []
    coverage(lake, [(2, 3), (0, 1), (0.5, 1.5), (4, 5)])
    assert covered_intervals(lake) == [
        (hours(0), hours(1.5)),
        (hours(2), hours(3)),
        (hours(4), hours(5)),
    ]


def test_prune_speed_deletes_only_covered_buckets(lake: LakeSettings) -> None:
    buckets = [hours(0.5), hours(1.5), hours(2.5), hours(3)]
    write_deltalake(lake.table("speed/ctr"), pa.table({
        "bucket_start": pa.array(buckets, pa.timestamp("us", "UTC")),
        "impressions": [1, 2, 3, 4],
    }))  # fmt: skip
    assert prune_speed(lake) == 0  # nothing covered yet
    coverage(lake, [(0, 1), (2, 3)])  # the gap [1, 2) and [3, …) stay speed
    assert prune_speed(lake) == 2
    left = DeltaTable(lake.table("speed/ctr")).to_pyarrow_table().column("bucket_start").to_pylist()
    assert sorted(left) == [hours(1.5), hours(3)]


def test_compaction_merges_small_files_and_keeps_rows(lake: LakeSettings) -> None:
    path = lake.table("batch/ctr")
    for n in range(4):
        write_deltalake(path, pa.table({"n": [n]}), mode="append")
    report = compact_and_vacuum(lake, "batch/ctr", retention_hours=0)
    assert report is not None
    assert (report.files_added, report.files_removed) == (1, 4)
    assert sorted(DeltaTable(path).to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2, 3]
    assert len(DeltaTable(path).file_uris()) == 1
    assert compact_and_vacuum(lake, "speed/ctr") is None  # no table yet: nothing to do
