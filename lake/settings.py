"""Where the Delta tables and the streaming checkpoints live.

The defaults are under the project's own ``data/`` folder, whichever directory a job starts
from (a relative default made a new, empty lake beside every other working directory); a
relative ``LAKE_ROOT`` or ``CHECKPOINT_ROOT`` given in the environment is taken from the
working directory, as usual for a path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_DATA: Final = Path(__file__).resolve().parents[1] / "data"


class LakeSettings(BaseSettings):
    """``LAKE_ROOT`` (the Delta tables) and ``CHECKPOINT_ROOT`` (Spark streaming state)."""

    model_config = SettingsConfigDict(extra="ignore")

    lake_root: Path = Field(default=PROJECT_DATA / "lake", validation_alias="LAKE_ROOT")
    checkpoint_root: Path = Field(
        default=PROJECT_DATA / "checkpoints", validation_alias="CHECKPOINT_ROOT"
    )
    # History kept per table (lake.retention): the streaming tables' log, the batch tables' log
    # (as-of queries), the data files of old versions (VACUUM).
    log_retention_hours: float = Field(
        default=24.0, gt=0, validation_alias="LAKE_LOG_RETENTION_HOURS"
    )
    history_retention_hours: float = Field(
        default=720.0, gt=0, validation_alias="LAKE_HISTORY_RETENTION_HOURS"
    )
    vacuum_retention_hours: float = Field(
        default=168.0, gt=0, validation_alias="LAKE_VACUUM_RETENTION_HOURS"
    )

    def retention(self, table: str) -> dict[str, str]:
        """The retention table properties of ``table`` (e.g. ``"master/events"``)."""
        from lake.retention import STREAMING_TABLES, retention_properties

        streaming = table in STREAMING_TABLES
        return retention_properties(
            log_hours=self.log_retention_hours if streaming else self.history_retention_hours,
            files_hours=self.vacuum_retention_hours,
        )

    def table(self, name: str) -> str:
        """Absolute location of a table, e.g. ``table("master/events")``."""
        return str((self.lake_root / name).absolute())

    def checkpoint(self, name: str) -> str:
        return str((self.checkpoint_root / name).absolute())
