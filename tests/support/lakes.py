"""A lake of a test's own: its tables under ``root/lake``, its streaming checkpoints under
``root/checkpoints`` (the ``lake`` fixture's, and the module fixtures' that fill one)."""

from __future__ import annotations

from pathlib import Path

from lake.settings import LakeSettings


def new_lake(root: Path) -> LakeSettings:
    return LakeSettings(lake_root=root / "lake", checkpoint_root=root / "checkpoints")
