"""Where a job finds the lake: the project's data/ by default, from any working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_lake_is_the_projects_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LAKE_ROOT", raising=False)
    monkeypatch.delenv("CHECKPOINT_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    lake = LakeSettings()
    assert MASTER_EVENTS.path(lake) == str(ROOT / "data" / "lake" / "master" / "events")
    assert lake.checkpoint("archiver") == str(ROOT / "data" / "checkpoints" / "archiver")


def test_a_relative_lake_root_is_taken_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKE_ROOT", "somewhere/lake")
    monkeypatch.chdir(tmp_path)
    assert MASTER_EVENTS.path(LakeSettings()) == str(tmp_path / "somewhere/lake/master/events")
