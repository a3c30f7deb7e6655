"""The archiver's settings (environment variables ARCHIVER_*)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ArchiverSettings(BaseSettings):
    """The archiver's own knobs (environment variables ``ARCHIVER_*``)."""

    model_config = SettingsConfigDict(env_prefix="ARCHIVER_", extra="ignore")

    trigger_seconds: float = Field(default=10.0, gt=0)
    max_offsets_per_trigger: int = Field(default=1_000_000, ge=1)
    starting_offsets: str = "earliest"
    # Offsets the checkpoint expects but the log no longer holds (retention, a lost broker):
    # stop and say so (true), or skip to the earliest offset still there (false).
    fail_on_data_loss: bool = True
    checkpoint_name: str = "archiver"
    # Seconds between two compactions and vacuums of the archiver's tables (between batches).
    maintenance_seconds: float = Field(default=900.0, gt=0)
    # Seconds between two full VACUUMs of those tables (the listing of every file: the only
    # way to find files a crashed attempt wrote); the other passes vacuum lite.
    full_vacuum_seconds: float = Field(default=86_400.0, gt=0)
