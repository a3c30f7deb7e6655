"""lake.retention: the history each table keeps, from LakeSettings (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lake.retention import interval, retention_properties
from lake.settings import LakeSettings


def test_intervals_are_whole_minutes_at_least_one() -> None:
    assert interval(24) == "interval 1440 minutes"
    assert interval(0.25) == "interval 15 minutes"
    assert interval(0) == "interval 1 minutes"


def test_streaming_tables_keep_the_log_window_and_the_others_the_history_window(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LAKE_LOG_RETENTION_HOURS", "2")
    monkeypatch.setenv("LAKE_HISTORY_RETENTION_HOURS", "48")
    monkeypatch.setenv("LAKE_VACUUM_RETENTION_HOURS", "0.5")
    lake = LakeSettings(lake_root=tmp_path)
    events = lake.retention("master/events")
    assert events["delta.logRetentionDuration"] == "interval 120 minutes"
    assert events["delta.deletedFileRetentionDuration"] == "interval 30 minutes"
    batch = lake.retention("batch/ctr_v3")
    assert batch["delta.logRetentionDuration"] == "interval 2880 minutes"
    assert batch == retention_properties(log_hours=48, files_hours=0.5, transaction_hours=48)
    assert batch["delta.enableExpiredLogCleanup"] == "true"
    # A batch view's run and hour ids expire with its history; a streaming writer's id never.
    assert batch["delta.setTransactionRetentionDuration"] == "interval 2880 minutes"
    assert "delta.setTransactionRetentionDuration" not in events


def test_defaults_keep_a_day_of_streaming_log_and_delta_s_month_of_history() -> None:
    lake = LakeSettings()
    assert (
        lake.retention("master/arrivals")["delta.logRetentionDuration"] == "interval 1440 minutes"
    )
    assert (
        lake.retention("views/registry")["delta.logRetentionDuration"] == "interval 43200 minutes"
    )
    assert lake.vacuum_retention_hours == 168
