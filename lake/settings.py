"""Where the Delta tables and the streaming checkpoints live."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class LakeSettings(BaseSettings):
    """``LAKE_ROOT`` (the Delta tables) and ``CHECKPOINT_ROOT`` (Spark streaming state)."""

    model_config = SettingsConfigDict(extra="ignore")

    lake_root: Path = Field(default=Path("data/lake"), validation_alias="LAKE_ROOT")
    checkpoint_root: Path = Field(
        default=Path("data/checkpoints"), validation_alias="CHECKPOINT_ROOT"
    )

    def table(self, name: str) -> str:
        """Absolute location of a table, e.g. ``table("master/events")``."""
        return str((self.lake_root / name).absolute())

    def checkpoint(self, name: str) -> str:
        return str((self.checkpoint_root / name).absolute())

    @property
    def events(self) -> str:
        from lake.catalog import MASTER_EVENTS

        return MASTER_EVENTS.path(self)

    @property
    def rejected(self) -> str:
        from lake.catalog import MASTER_REJECTED

        return MASTER_REJECTED.path(self)
