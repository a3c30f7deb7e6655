"""The speed job's settings (environment variables SPEED_*)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_DURATION = re.compile(r"^\s*(\d+)\s*(second|minute|hour|day)s?\s*$", re.IGNORECASE)
_UNIT_MS = {"second": 1_000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


class SpeedSettings(BaseSettings):
    """The speed job's knobs (environment variables ``SPEED_*``)."""

    model_config = SettingsConfigDict(env_prefix="SPEED_", extra="ignore")

    # The port the speed job serves its Prometheus metrics on (http://CTR_METRICS_HOST:port/metrics;
    # docs/reference/metrics.md); unset: none. 0: a port the system chooses (logged).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)

    # Seconds between the starts of two micro-batches of `ctr speed` (Spark's processing-time
    # trigger); --available-now ignores it.
    trigger_seconds: float = Field(default=1.0, gt=0)
    # How far behind the newest event time a bucket stays open for late events: a duration
    # such as '10 minutes' or '30 seconds' (second, minute, hour or day).
    watermark: str = "10 minutes"
    # Where a first start (no checkpoint) begins: the whole retained log by default.
    starting_offsets: str = "earliest"
    # Records one micro-batch reads from the topic at most, over all partitions (Spark's
    # maxOffsetsPerTrigger).
    max_offsets_per_trigger: int = Field(default=200_000, ge=1)
    # Offsets the checkpoint expects but the log no longer holds: stop (true) or skip (false).
    fail_on_data_loss: bool = True
    # The speed job's streaming checkpoint: the folder of that name under CHECKPOINT_ROOT.
    checkpoint_name: str = "speed"
    # Seconds between two roll-ups of the buckets the watermark closed (one row per key each)
    # and compactions of the past minutes' micro-batch files, done beside the micro-batches
    # (in a thread of the job's own).
    rollup_seconds: float = Field(default=60.0, gt=0)
    # Seconds between two maintenance passes of the job (beside the micro-batches): deleting the
    # buckets the batch layer covers, merging closed hours' roll-ups, compacting speed/late,
    # vacuuming.
    maintenance_seconds: float = Field(default=300.0, gt=0)
    # Hours of versions of speed/ctr and speed/late kept for as-of queries (log entries and
    # data files).
    vacuum_retention_hours: float = Field(default=48.0, ge=0)
    # Micro-batches that change a partition's attribution state between two snapshots of it:
    # a cold start (a new executor, a driver on another host) reads one snapshot and at most
    # this many change files per partition; a snapshot writes the partition's open
    # impressions (about 30 bytes each).
    state_snapshot_batches: int = Field(default=120, ge=1)

    @property
    def watermark_ms(self) -> int:
        """The watermark's delay in milliseconds."""
        match = _DURATION.match(self.watermark)
        assert match is not None  # validated
        return int(match[1]) * _UNIT_MS[match[2].lower()]

    @field_validator("watermark")
    @classmethod
    def _check_watermark(cls, value: str) -> str:
        if not _DURATION.match(value):
            raise ValueError(
                f"SPEED_WATERMARK must look like '10 minutes' or '30 seconds', got {value!r}"
            )
        return value.strip()
