"""The archiver's settings (environment variables ARCHIVER_*)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ArchiverSettings(BaseSettings):
    """The archiver's own knobs (environment variables ``ARCHIVER_*``)."""

    model_config = SettingsConfigDict(env_prefix="ARCHIVER_", extra="ignore")

    # The port the archiver serves its Prometheus metrics on (http://CTR_METRICS_HOST:port/metrics;
    # docs/reference/metrics.md); unset: none. 0: a port the system chooses (logged).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)

    # Seconds between the starts of two micro-batches of `ctr archive` (Spark's processing-time
    # trigger); --available-now ignores it.
    trigger_seconds: float = Field(default=10.0, gt=0)
    # Records one micro-batch reads from the topic at most, over all partitions (Spark's
    # maxOffsetsPerTrigger).
    max_offsets_per_trigger: int = Field(default=1_000_000, ge=1)
    # Where a new checkpoint starts reading the topic (Spark's startingOffsets): earliest (all
    # the log retains), latest, or a JSON object of offsets per partition. A checkpoint that
    # exists resumes at its own offsets.
    starting_offsets: str = "earliest"
    # Offsets the checkpoint expects but the log no longer holds (retention, a lost broker):
    # stop and say so (true), or skip to the earliest offset still there (false).
    fail_on_data_loss: bool = True
    # The archiver's streaming checkpoint: the folder of that name under CHECKPOINT_ROOT.
    checkpoint_name: str = "archiver"
    # Seconds between two compactions and vacuums of the archiver's tables (in a thread of its
    # own, beside the micro-batches).
    maintenance_seconds: float = Field(default=900.0, gt=0)
    # Seconds between two full VACUUMs of those tables (the listing of every file: the only
    # way to find files a crashed attempt wrote); the other passes vacuum lite.
    full_vacuum_seconds: float = Field(default=86_400.0, gt=0)
