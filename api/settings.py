"""``ApiSettings``: the HTTP API's configuration, from ``API_*`` environment variables."""

from __future__ import annotations

from pydantic import ByteSize, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_TOKEN_LENGTH = 16


class ApiSettings(BaseSettings):
    """``API_TOKEN`` is required: the server refuses to start without one (no open default)."""

    model_config = SettingsConfigDict(env_prefix="API_", extra="ignore")

    token: SecretStr
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    max_range_days: int = Field(default=31, ge=1)
    max_rows: int = Field(default=100_000, ge=1)
    sql_max_rows: int = Field(default=10_000, ge=1)
    sql_timeout_s: float = Field(default=10.0, gt=0)
    # Per SQL worker process: DuckDB's memory limit, and the address-space cap above what the
    # worker mapped at start.
    sql_memory_limit: ByteSize = Field(default=ByteSize(2**30), ge=64 * 2**20)
    # JSON bytes of rows per SQL answer; the rest is cut off and the answer says so.
    sql_max_bytes: ByteSize = Field(default=ByteSize(16 * 2**20), ge=1024)
    sql_workers: int = Field(default=2, ge=1, le=64)
    sql_queue: int = Field(default=4, ge=0)
    sql_queue_timeout_s: float = Field(default=30.0, gt=0)
    # Request bodies larger than this get a 413 (after the token check, before parsing).
    max_body_bytes: ByteSize = Field(default=ByteSize(2**20), ge=1024)
    refresh_s: float = Field(default=0.5, ge=0)
    cache_entries: int = Field(default=256, ge=0)
    cache_stale_s: float = Field(default=2.0, ge=0)
    # /metrics reads the dead-letter topic's depth from Kafka at most every dlq_refresh_s.
    dlq_refresh_s: float = Field(default=10.0, ge=0)
    kafka_timeout_s: float = Field(default=1.0, gt=0)

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        secret = value.get_secret_value().strip()
        if len(secret) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"API_TOKEN must be at least {MIN_TOKEN_LENGTH} characters "
                "(generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return SecretStr(secret)
