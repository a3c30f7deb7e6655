"""``ApiSettings``: the HTTP API's configuration, from ``API_*`` environment variables."""

from __future__ import annotations

from pydantic import ByteSize, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_TOKEN_LENGTH = 16


class ApiSettings(BaseSettings):
    """``API_TOKEN`` is required: the server refuses to start without one (no open default).
    It is the bootstrap admin key; the others come from the key store (`ctr keys`)."""

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
    # Of the workers, one key's queries hold at most sql_workers_per_key (default: one fewer
    # than sql_workers, so another key always finds one); of the queue, half.
    sql_workers_per_key: int | None = Field(default=None, ge=1)
    sql_queue: int = Field(default=4, ge=0)
    sql_queue_timeout_s: float = Field(default=30.0, gt=0)
    # A key whose SQL queries cost workers (stopped at the time limit: a strike; crashed, killed
    # or out of memory: two) gets 429 for sql_backoff_s after its first strike, doubling with
    # each strike up to sql_max_backoff_s; a strike is forgiven per sql_forgive_s without one.
    sql_backoff_s: float = Field(default=1.0, gt=0)
    sql_max_backoff_s: float = Field(default=60.0, gt=0)
    sql_forgive_s: float = Field(default=60.0, gt=0)
    # Request bodies larger than this get a 413 (after the token check, before parsing).
    max_body_bytes: ByteSize = Field(default=ByteSize(2**20), ge=1024)
    # How often the lake's snapshot is refreshed while requests come (each refresh lists every
    # table's Delta log: on object storage, raise it to save requests).
    refresh_s: float = Field(default=0.25, ge=0)
    cache_entries: int = Field(default=256, ge=0)
    cache_stale_s: float = Field(default=2.0, ge=0)
    # /metrics reads the dead-letter topic's depth from Kafka at most every dlq_refresh_s.
    dlq_refresh_s: float = Field(default=10.0, ge=0)
    kafka_timeout_s: float = Field(default=1.0, gt=0)
    # /metrics answers this bearer token (or API_TOKEN and admin keys); unset: those only.
    metrics_token: SecretStr | None = None
    # When each key was last used (`ctr keys list`) is written to the key store at most this
    # often (one small commit per API process).
    key_use_flush_s: float = Field(default=60.0, gt=0)
    # A line per request on stderr (logger ctr.access): the key's name (never the key), its
    # role, the method, route and status.
    access_log: bool = True

    # -- the edge (api/edge.py): checked before a request is parsed --------------------------
    # The request line plus headers in bytes (431), headers (431), the request line (414).
    max_header_bytes: ByteSize = Field(default=ByteSize(32 * 2**10), ge=1024)
    max_headers: int = Field(default=100, ge=1)
    max_request_line_bytes: ByteSize = Field(default=ByteSize(8 * 2**10), ge=256)
    # A request's headers within this many seconds of its first byte, its body within this
    # many seconds of its headers (408).
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    # Open connections from one client address, and in all (429).
    max_connections_per_client: int = Field(default=64, ge=1)
    max_connections: int = Field(default=1024, ge=1)
    # Idle keep-alive connections are closed after this many seconds.
    keep_alive_s: float = Field(default=5.0, gt=0)

    # -- /api/v1/ctr's answers (the SQL route's discipline) -----------------------------------
    # Answers computed at once, of which one key may hold ctr_workers_per_key (default: half of
    # ctr_workers, so one key never holds them all); up to ctr_queue wait, half of them at most
    # one key's, each at most ctr_queue_timeout_s (then 429).
    ctr_workers: int = Field(default=4, ge=1, le=64)
    ctr_workers_per_key: int | None = Field(default=None, ge=1)
    ctr_queue: int = Field(default=64, ge=0)
    ctr_queue_timeout_s: float = Field(default=10.0, gt=0)
    # A query running longer is stopped (400).
    ctr_timeout_s: float = Field(default=10.0, gt=0)
    # DuckDB's memory limit for the serving database (queries, the in-memory speed and coverage
    # tables of the versions in use, its cache of Parquet data); past it a query fails instead
    # of growing the process. Too tight a limit evicts the Parquet cache (the serving benchmark's
    # p99 doubled at 1 GiB).
    ctr_memory_limit: ByteSize = Field(default=ByteSize(4 * 2**30), ge=64 * 2**20)
    # An answer larger than this (JSON or CSV bytes) is refused (400 naming 'limit').
    ctr_max_bytes: ByteSize = Field(default=ByteSize(32 * 2**20), ge=1024)
    # The response cache's bytes; an answer over an eighth of it is not cached.
    cache_max_bytes: ByteSize = Field(default=ByteSize(64 * 2**20), ge=0)

    # A refused answer (over ctr_max_bytes, stopped at ctr_timeout_s or the memory limit) is
    # remembered for the snapshot it was computed on and, this many seconds, for later ones
    # (the lake only grows meanwhile): asking again costs nothing. 0: the snapshot's only.
    ctr_refusal_s: float = Field(default=60.0, ge=0)

    @property
    def ctr_per_key(self) -> int:
        """``ctr_workers_per_key``, by default half of ``ctr_workers`` (at least 1)."""
        return _share(self.ctr_workers_per_key, self.ctr_workers, max(1, self.ctr_workers // 2))

    @property
    def sql_per_key(self) -> int:
        """``sql_workers_per_key``, by default one fewer than ``sql_workers`` (at least 1)."""
        return _share(self.sql_workers_per_key, self.sql_workers, max(1, self.sql_workers - 1))

    @field_validator("token", "metrics_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value().strip()
        if len(secret) < MIN_TOKEN_LENGTH:
            name = f"API_{str(info.field_name).upper()}"
            raise ValueError(
                f"{name} must be at least {MIN_TOKEN_LENGTH} characters "
                "(generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return SecretStr(secret)


def _share(setting: int | None, workers: int, default: int) -> int:
    return default if setting is None else min(setting, workers)
