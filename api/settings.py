"""``ApiSettings``: the HTTP API's configuration, from ``API_*`` environment variables."""

from __future__ import annotations

import ipaddress

from pydantic import ByteSize, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_TOKEN_LENGTH = 16
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ApiSettings(BaseSettings):
    """``API_TOKEN`` is required: the server refuses to start without one (no open default).
    It is the bootstrap admin key; the others come from the key store (`ctr keys`)."""

    model_config = SettingsConfigDict(env_prefix="API_", extra="ignore")

    # The bootstrap admin key (at least 16 characters): clients send it as 'Authorization:
    # Bearer <API_TOKEN>'. Required: the server refuses to start without it. A secret: never
    # printed.
    token: SecretStr
    # The address the server binds (`ctr serve --host` overrides it); the default, loopback,
    # takes connections from this machine only.
    host: str = "127.0.0.1"
    # The TCP port the server listens on (`ctr serve --port` overrides it).
    port: int = Field(default=8000, ge=1, le=65535)
    # The longest range (end minus start) of one /api/v1/ctr query, in days; a longer one is
    # refused (400 naming end).
    max_range_days: int = Field(default=31, ge=1)
    # The most rows one /api/v1/ctr query may ask for (its limit; a larger one is refused,
    # 400 naming limit); a query without a limit gets at most 10,000.
    max_rows: int = Field(default=100_000, ge=1)
    # The most rows of one SQL answer, and what a request without max_rows gets: the rest is
    # cut off and the answer says so; a request asking for more is refused (400).
    sql_max_rows: int = Field(default=10_000, ge=1)
    # Seconds one SQL query may run: past it, it is stopped (503) and its key gets a strike
    # (see sql_backoff_s).
    sql_timeout_s: float = Field(default=10.0, gt=0)
    # Per SQL worker process: DuckDB's memory limit, and the address-space cap above what the
    # worker mapped at start.
    sql_memory_limit: ByteSize = Field(default=ByteSize(2**30), ge=64 * 2**20)
    # JSON bytes of rows per SQL answer; the rest is cut off and the answer says so.
    sql_max_bytes: ByteSize = Field(default=ByteSize(16 * 2**20), ge=1024)
    # SQL worker processes (sandboxed DuckDB, started at the first query): queries run at once.
    sql_workers: int = Field(default=2, ge=1, le=64)
    # SQL workers one key's queries may hold at once (at most sql_workers). Unset: one fewer
    # than sql_workers (at least 1), so another key always finds one. A key's queries may also
    # fill at most half of sql_queue.
    sql_workers_per_key: int | None = Field(default=None, ge=1)
    # SQL queries that may wait for a worker beside those running; past that (or past a key's
    # half of it), a query is refused at once (429). 0: no waiting.
    sql_queue: int = Field(default=4, ge=0)
    # Seconds a SQL query waits for a worker; then it is refused (429).
    sql_queue_timeout_s: float = Field(default=30.0, gt=0)
    # Seconds a key whose SQL query cost a worker (stopped at the time limit: a strike;
    # crashed, killed or out of memory: two) is refused (429) after its first strike; the pause
    # doubles with each strike it still has, up to sql_max_backoff_s.
    sql_backoff_s: float = Field(default=1.0, gt=0)
    # The longest pause, in seconds, of a key backed off for its costly SQL queries (the
    # doubling of sql_backoff_s stops there).
    sql_max_backoff_s: float = Field(default=60.0, gt=0)
    # Seconds without a new strike after which one of a key's SQL strikes is forgiven (a
    # successful query forgives nothing).
    sql_forgive_s: float = Field(default=60.0, gt=0)
    # Request bodies larger than this get a 413 (after the token check, before parsing).
    max_body_bytes: ByteSize = Field(default=ByteSize(2**20), ge=1024)
    # Seconds between two looks at the speed layer's table (speed/ctr, a commit a second) and
    # the speed job's status while requests come: one object-store request each when nothing
    # changed; 0: every table on every request.
    refresh_s: float = Field(default=1.0, ge=0)
    # Seconds between two looks at each of the other tables' logs (the batch layer's, the
    # master tables', the registry: they change with a batch run or an archiver's commit)
    # while requests come; at least refresh_s. A client that sends the versions it has seen
    # (the Ctr-Versions header) makes the API look at once.
    refresh_seldom_s: float = Field(default=10.0, ge=0)
    # Seconds between two looks for a new commit of the key store (access/keys) while requests
    # come: a revoked or created key takes effect within it on every API process (one
    # object-store request per look instead of one per request); 0: on every request.
    keys_check_s: float = Field(default=0.5, ge=0)
    # /api/v1/ctr answers the response cache keeps, least recently used dropped first; 0: no
    # cache.
    cache_entries: int = Field(default=256, ge=0)
    # Seconds a request may be answered from an older snapshot (the lake's, a cached answer's)
    # while a background thread brings it up to date; 0: each request waits for the current one.
    cache_stale_s: float = Field(default=2.0, ge=0)
    # Seconds between two readings of the dead-letter topic's depth from Kafka for /metrics
    # (at most one per this interval, whatever the scrapes).
    dlq_refresh_s: float = Field(default=10.0, ge=0)
    # Seconds /metrics waits for Kafka when it reads the dead-letter topic's depth; without an
    # answer the depth is left out of /metrics until Kafka answers again.
    kafka_timeout_s: float = Field(default=1.0, gt=0)
    # /metrics answers this bearer token (or API_TOKEN and admin keys); unset: those only.
    metrics_token: SecretStr | None = None
    # When each key was last used (`ctr keys list`) is written to the key store at most once
    # per this many seconds (one small commit per API process; with API_LIMITS_URL, one for all
    # the replicas).
    key_use_flush_s: float = Field(default=60.0, gt=0)
    # The store of the limits that hold across the API's replicas (several `ctr serve` behind
    # one load balancer): a PostgreSQL database, postgresql://user:password@host:port/database,
    # where each key's share of the CTR and SQL workers, the SQL back-off and the keys' last
    # uses are counted for every replica (tables in the schema ctr_limits, created on first
    # use). Unreachable: the requests it counts get a 503. Unset: each process counts its own
    # (one replica). A secret: never printed.
    limits_url: SecretStr | None = None
    # A line per request on stderr (logger ctr.access): the key's name (never the key), its
    # role, the method, route and status.
    access_log: bool = True

    # -- the edge (api/edge.py): checked before a request is parsed --------------------------
    # The most bytes of a request's head (the request line plus its headers); a larger head
    # is refused (431).
    max_header_bytes: ByteSize = Field(default=ByteSize(32 * 2**10), ge=1024)
    # The most headers of one request; more are refused (431).
    max_headers: int = Field(default=100, ge=1)
    # The most bytes of a request line (method, target, version); a longer one is refused
    # (414).
    max_request_line_bytes: ByteSize = Field(default=ByteSize(8 * 2**10), ge=256)
    # Seconds a request's headers may take to arrive after its first byte (or the
    # connection's start); a slower request is refused (408).
    header_timeout_s: float = Field(default=10.0, gt=0)
    # Seconds a request's body may take to arrive after its headers; a slower one is refused
    # (408).
    body_timeout_s: float = Field(default=30.0, gt=0)
    # Open connections from one client address at most; a request on a connection past it is
    # refused (429).
    max_connections_per_client: int = Field(default=64, ge=1)
    # Open connections in all at most; a request on a connection past it is refused (429).
    max_connections: int = Field(default=1024, ge=1)
    # Idle keep-alive connections are closed after this many seconds.
    keep_alive_s: float = Field(default=5.0, gt=0)
    # Load balancers and reverse proxies whose X-Forwarded-For is believed: addresses or CIDRs,
    # comma-separated (10.0.0.5,10.1.0.0/16). A request from one of them is taken to come from
    # the client the header names (the last address in it that is not itself a trusted proxy:
    # per-client limits, the access log); from any other peer the header is ignored. Their
    # connections are not capped per client (each carries many clients): cap clients at the
    # balancer (docs: Run several API replicas). Empty: no proxy is trusted.
    trusted_proxies: str = ""

    # -- the PostgreSQL endpoint (api/pg_wire.py): the views for psql, BI tools, notebooks ----
    # The TCP port of the PostgreSQL wire protocol (`ctr serve --pg-port` overrides it): the
    # key is the password, the queries are POST /api/v1/sql's with its limits. Unset: off.
    pg_port: int | None = Field(default=None, ge=0, le=65535)
    # The address the PostgreSQL endpoint binds; unset: API_HOST's.
    pg_host: str | None = None
    # The PEM certificate (chain) the PostgreSQL endpoint presents to clients that ask for
    # TLS (sslmode=require); with API_PG_TLS_KEY. Unset: TLS refused, plain text only.
    pg_tls_cert: str | None = None
    # The PEM private key of API_PG_TLS_CERT.
    pg_tls_key: str | None = None
    # Refuse PostgreSQL connections that do not ask for TLS (before their password is sent);
    # needs API_PG_TLS_CERT and API_PG_TLS_KEY.
    pg_tls_required: bool = False
    # Open PostgreSQL connections in all at most; past it a new one is refused (SQLSTATE 53300).
    pg_max_connections: int = Field(default=256, ge=1)
    # Open PostgreSQL connections from one client address at most; past it a new one is
    # refused (53300). A key's queries also share the SQL workers as over HTTP
    # (API_SQL_WORKERS_PER_KEY).
    pg_max_connections_per_client: int = Field(default=32, ge=1)
    # The largest PostgreSQL message (a query's text, a Bind's parameters) a connection may
    # send; a larger one ends the connection (SQLSTATE 54000) before it is read. A query's text
    # is parsed on the API's event loop: this bounds how long one can hold it.
    pg_max_message_bytes: ByteSize = Field(default=ByteSize(256 * 2**10), ge=1024)

    # -- /api/v1/ctr's answers (the SQL route's discipline) -----------------------------------
    # /api/v1/ctr answers computed at once, each on a thread of its own.
    ctr_workers: int = Field(default=4, ge=1, le=64)
    # Answers one key may have computed at once (at most ctr_workers). Unset: half of
    # ctr_workers (at least 1), so one key never holds them all.
    ctr_workers_per_key: int | None = Field(default=None, ge=1)
    # /api/v1/ctr requests that may wait for a place beside those computed, half of them at
    # most one key's; past that, a request is refused at once (429). 0: no waiting.
    ctr_queue: int = Field(default=64, ge=0)
    # Seconds a /api/v1/ctr request waits for a place; then it is refused (429).
    ctr_queue_timeout_s: float = Field(default=10.0, gt=0)
    # Seconds one /api/v1/ctr query may run; a query running longer is stopped (503, with
    # Retry-After: ctr_refusal_s).
    ctr_timeout_s: float = Field(default=10.0, gt=0)
    # DuckDB's memory limit for the serving database (queries, the in-memory speed and coverage
    # tables of the versions in use, its cache of Parquet data); past it a query fails instead
    # of growing the process. Too tight a limit evicts the Parquet cache (the serving benchmark's
    # p99 doubled at 1 GiB).
    ctr_memory_limit: ByteSize = Field(default=ByteSize(4 * 2**30), ge=64 * 2**20)
    # Sketches and bitmaps one answer's reach may bring into the process (the hour rows'
    # bitmaps, the reach cube's, the estimated buckets' sketches); past it a 400, before they
    # are fetched. make demo's last hour needs about 1.1 M (its speed rows' sketches).
    ctr_reach_max_values: int = Field(default=2_000_000, ge=1)
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

    @model_validator(mode="after")
    def _pg_tls(self) -> ApiSettings:
        if (self.pg_tls_cert is None) != (self.pg_tls_key is None):
            raise ValueError("API_PG_TLS_CERT and API_PG_TLS_KEY go together: set both or neither")
        if self.pg_tls_required and self.pg_tls_cert is None:
            raise ValueError(
                "API_PG_TLS_REQUIRED needs API_PG_TLS_CERT and API_PG_TLS_KEY (the certificate "
                "the endpoint presents)"
            )
        return self

    @field_validator("limits_url")
    @classmethod
    def _postgresql_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        url = value.get_secret_value().strip()
        if not url.startswith(("postgresql://", "postgres://")):
            # The value is not quoted back: it may hold a password.
            raise ValueError("API_LIMITS_URL must be a postgresql://user:password@host/db URL")
        return SecretStr(url)

    @property
    def trusted_proxy_networks(self) -> tuple[IPNetwork, ...]:
        """``trusted_proxies`` as networks (an address is a network of one)."""
        return _networks(self.trusted_proxies)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        return ",".join(str(network) for network in _networks(value))

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


def _networks(listed: str) -> tuple[IPNetwork, ...]:
    """Comma-separated addresses and CIDRs as networks; a ValueError naming a bad entry."""
    networks = []
    for entry in filter(None, (part.strip() for part in listed.split(","))):
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"API_TRUSTED_PROXIES: {entry!r} is neither an IP address nor a CIDR "
                "(10.0.0.5, 10.1.0.0/16)"
            ) from None
    return tuple(networks)


def _share(setting: int | None, workers: int, default: int) -> int:
    return default if setting is None else min(setting, workers)
