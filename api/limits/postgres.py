"""The limits store of several replicas: PostgreSQL (``API_LIMITS_URL``).

Why PostgreSQL: the cluster profile runs it already (Airflow's metadata database), and it has
what the limits need — transactions and advisory locks, so a key's leases are counted and
taken as one step, and one replica at a time is elected to commit the keys' last uses — and
a clock of its own (``clock_timestamp()``) that times the back-off whatever the hosts' clocks
say. Redis would be one more service to run; the lake (an object store) costs a request, and
tens of milliseconds, per check.

The tables live in the schema ``ctr_limits``, created on first use. Each check is one round
trip: several statements sent in one message run as one transaction (PostgreSQL's simple-query
protocol). The store is used from threads (a pool of connections), never from an event loop.
Any failure to reach it is a :class:`~api.errors.LimitsUnavailableError` (a 503): a request
that counts against a limit is never served past a count nobody kept.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar, cast

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from pydantic import SecretStr

from api.errors import LimitsUnavailableError
from api.limits.shared_key_uses import SharedKeyUses
from api.limits.store import Lease
from lake.settings import LakeSettings
from serving_layer.sandbox.backoff import ClientBackoff

T = TypeVar("T")

SCHEMA: Final = "ctr_limits"
# How the store's connections name themselves to the server (pg_stat_activity).
APPLICATION_NAME: Final = "ctr-api-limits"
# Seconds a lease outlives its computation's time limits: past them, it is a crashed replica's.
LEASE_MARGIN_S: Final = 15.0
# Advisory locks' first key, per purpose (the second: 0, or a hash of what is locked).
_SCHEMA_LOCK: Final = 0x63_74_72_00  # "ctr\0"
_LEASE_LOCK: Final = 0x63_74_72_01
_BACKOFF_LOCK: Final = 0x63_74_72_02
_KEY_USES_LOCK: Final = 0x63_74_72_03

_TABLES: Final = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.leases (
    id bigserial PRIMARY KEY,
    what text NOT NULL,
    client text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_of_client ON {SCHEMA}.leases (what, client);
CREATE TABLE IF NOT EXISTS {SCHEMA}.sql_backoffs (
    client text PRIMARY KEY,
    strikes integer NOT NULL,
    struck_at timestamptz NOT NULL,
    until timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.key_uses (
    name text PRIMARY KEY,
    used_at timestamptz NOT NULL,
    committed_use timestamptz
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.key_use_commits (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    committed_at timestamptz NOT NULL
);
"""

_TAKE_LEASE: Final = f"""
SELECT pg_advisory_xact_lock({_LEASE_LOCK}, hashtext(%(what)s || ' ' || %(client)s));
DELETE FROM {SCHEMA}.leases
WHERE what = %(what)s AND client = %(client)s AND expires_at <= clock_timestamp();
INSERT INTO {SCHEMA}.leases (what, client, expires_at)
SELECT %(what)s, %(client)s, clock_timestamp() + make_interval(secs => %(ttl_s)s)
WHERE (SELECT count(*) FROM {SCHEMA}.leases WHERE what = %(what)s AND client = %(client)s)
    < %(share)s
RETURNING id
"""

_BACKOFF_WAIT: Final = f"""
SELECT greatest(0, extract(epoch FROM until - clock_timestamp()))::float8
FROM {SCHEMA}.sql_backoffs WHERE client = %(client)s
"""

_BACKOFF_STRIKES: Final = f"""
SELECT strikes, extract(epoch FROM clock_timestamp() - struck_at)::float8
FROM {SCHEMA}.sql_backoffs WHERE client = %(client)s
"""

_BACKOFF_READ_FOR_STRIKE: Final = f"""
BEGIN;
SELECT pg_advisory_xact_lock({_BACKOFF_LOCK}, hashtext(%(client)s));
SELECT clock_timestamp(), b.strikes, b.struck_at
FROM (SELECT 1) AS one LEFT JOIN {SCHEMA}.sql_backoffs AS b ON b.client = %(client)s
"""

_BACKOFF_WRITE_STRIKE: Final = f"""
INSERT INTO {SCHEMA}.sql_backoffs (client, strikes, struck_at, until)
VALUES (%(client)s, %(strikes)s, %(now)s, %(now)s + make_interval(secs => %(pause_s)s))
ON CONFLICT (client) DO UPDATE
SET strikes = excluded.strikes, struck_at = excluded.struck_at, until = excluded.until;
DELETE FROM {SCHEMA}.sql_backoffs
WHERE until <= clock_timestamp()
    AND struck_at + make_interval(secs => strikes * %(forgive_s)s) <= clock_timestamp();
COMMIT
"""

# Keys' uses: each replica's pushed every few seconds; one replica at a time elected to commit
# those not committed yet to the lake, when the last commit is API_KEY_USE_FLUSH_S old.
_PUSH_KEY_USES: Final = f"""
INSERT INTO {SCHEMA}.key_uses AS k (name, used_at) VALUES %s
ON CONFLICT (name) DO UPDATE SET used_at = greatest(k.used_at, excluded.used_at)
"""

_ELECT_COMMITTER: Final = f"""
BEGIN;
SELECT pg_try_advisory_xact_lock({_KEY_USES_LOCK}, 0)
    AND coalesce(
        (SELECT committed_at FROM {SCHEMA}.key_use_commits)
            <= clock_timestamp() - make_interval(secs => %(flush_s)s),
        true
    )
"""

_PENDING_KEY_USES: Final = f"""
SELECT name, used_at FROM {SCHEMA}.key_uses
WHERE committed_use IS NULL OR used_at > committed_use
ORDER BY name
"""

_MARK_COMMITTED: Final = f"""
UPDATE {SCHEMA}.key_uses AS k SET committed_use = v.used_at
FROM (VALUES %s) AS v (name, used_at)
WHERE k.name = v.name AND (k.committed_use IS NULL OR k.committed_use < v.used_at)
"""

# With the elected replica's housekeeping: the lapsed leases of clients not seen again.
_COMMITTED_AND_TIDY: Final = f"""
INSERT INTO {SCHEMA}.key_use_commits (committed_at) VALUES (clock_timestamp())
ON CONFLICT (one) DO UPDATE SET committed_at = excluded.committed_at;
DELETE FROM {SCHEMA}.leases WHERE expires_at <= clock_timestamp();
COMMIT
"""


class Cursor(Protocol):
    """What the store asks of a psycopg2 cursor."""

    def execute(self, query: str, parameters: object = None) -> None: ...

    def fetchone(self) -> tuple[Any, ...] | None: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


class _ConnectionLostError(Exception):
    """A pooled connection broke under a statement (the server restarted, say)."""

    def __init__(self, cause: psycopg2.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


class PostgresLimits:
    """The limits of every replica that names the same database; thread-safe.

    ``connections``: at most this many at once (the rest wait for one), opened as needed and
    kept open; ``timeout_s``: how long connecting, or one statement, may take before the store
    counts as unreachable;
    ``push_s``: how often keys' uses are written to the database (a crash loses at most this
    much of them).
    """

    shared = True

    def __init__(
        self,
        url: SecretStr,
        *,
        connections: int = 8,
        timeout_s: float = 5.0,
        push_s: float = 2.0,
    ) -> None:
        if connections < 1:
            raise ValueError(f"'connections' must be >= 1, got {connections}")
        if timeout_s <= 0:
            raise ValueError(f"'timeout_s' must be > 0, got {timeout_s}")
        if push_s <= 0:
            raise ValueError(f"'push_s' must be > 0, got {push_s}")
        self.push_s = push_s
        self._url = url
        self._timeout_s = timeout_s
        # The connections not in use, the latest returned last. (psycopg2's own pools close
        # every connection returned past their minimum, and open the minimum at once.)
        self._idle: list[psycopg2.extensions.connection] = []
        self._idle_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(connections)
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    def shares(self, what: str, *, longest_s: float) -> PostgresShares:
        return PostgresShares(self, what, ttl_s=longest_s + LEASE_MARGIN_S)

    def backoffs(self, policy: ClientBackoff, clock: Callable[[], float]) -> PostgresBackoffs:
        # The database's clock times the back-off: ``clock`` is the process's, not used.
        return PostgresBackoffs(self, policy)

    def key_uses(self, lake: LakeSettings, flush_s: float) -> SharedKeyUses:
        return SharedKeyUses(self, lake, flush_s=flush_s)

    def close(self) -> None:
        """Close the connections (once nothing uses the store)."""
        self._drop_idle()

    def _drop_idle(self) -> None:
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def check(self) -> None:
        """Reach the database and create the tables if they are missing (the first call of
        every other method does so too); :class:`LimitsUnavailableError` if it cannot."""
        self.run(lambda cursor: None)

    def push_key_uses(self, used: dict[str, dt.datetime]) -> None:
        """Keep, of each key's use in ``used`` and the one the database has, the latest."""
        if used:
            self.run(
                lambda cursor: psycopg2.extras.execute_values(
                    cursor, _PUSH_KEY_USES, sorted(used.items())
                )
            )

    def commit_key_uses(
        self, flush_s: float, commit: Callable[[dict[str, dt.datetime]], None]
    ) -> int:
        """If this replica is elected (no other is committing, and the last commit of any is
        at least ``flush_s`` old by the database's clock) and some keys' uses are not
        committed yet: ``commit`` them (to the lake) and mark them so. The number of keys
        committed (0: none)."""

        def elected_commit(cursor: Cursor) -> int:
            cursor.execute(_ELECT_COMMITTER, {"flush_s": flush_s})
            if not cast(tuple[bool], cursor.fetchone())[0]:
                cursor.execute("ROLLBACK")
                return 0
            cursor.execute(_PENDING_KEY_USES)
            pending = {str(name): at for name, at in cursor.fetchall()}
            if not pending:
                cursor.execute("ROLLBACK")
                return 0
            # The lock is held meanwhile: no other replica commits these too.
            commit(pending)
            psycopg2.extras.execute_values(cursor, _MARK_COMMITTED, sorted(pending.items()))
            cursor.execute(_COMMITTED_AND_TIDY)
            return len(pending)

        return self.run(elected_commit)

    def run(self, work: Callable[[Cursor], T]) -> T:
        """``work`` with a cursor of a pooled connection (autocommit: each message is a
        transaction of its own, unless it begins one, which ``work`` ends). A connection that
        broke under it (the server restarted: the idle ones are broken too) is replaced, the
        idle ones dropped, and ``work`` tried once more. Any error of the database's, or none
        answering, is a :class:`LimitsUnavailableError`."""
        try:
            return self._attempt(work)
        except _ConnectionLostError:
            self._drop_idle()
        try:
            return self._attempt(work)
        except _ConnectionLostError as lost:
            raise LimitsUnavailableError(_unreachable(lost.cause)) from None

    def _attempt(self, work: Callable[[Cursor], T]) -> T:
        with self._slots:
            connection = self._connection()
            try:
                with connection.cursor() as cursor:
                    self._ensure_schema(cursor)
                    return work(cursor)
            except psycopg2.Error as exc:
                if connection.closed:
                    raise _ConnectionLostError(exc) from None
                raise LimitsUnavailableError(_unreachable(exc)) from None
            finally:
                if not connection.closed and _in_transaction(connection):
                    # ``work`` failed between its BEGIN and its COMMIT.
                    _roll_back(connection)
                if _usable(connection):
                    with self._idle_lock:
                        self._idle.append(connection)
                else:
                    connection.close()

    def _connection(self) -> psycopg2.extensions.connection:
        """An idle connection, else a new one."""
        with self._idle_lock:
            if self._idle:
                return self._idle.pop()
        try:
            connection = psycopg2.connect(
                self._url.get_secret_value(),
                connect_timeout=max(1, round(self._timeout_s)),
                options=f"-c statement_timeout={round(self._timeout_s * 1000)}",
                application_name=APPLICATION_NAME,
            )
        except psycopg2.Error as exc:
            raise LimitsUnavailableError(_unreachable(exc)) from None
        connection.autocommit = True
        return cast(psycopg2.extensions.connection, connection)

    def _ensure_schema(self, cursor: Cursor) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            cursor.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (SCHEMA,))
            create_schema = "" if cursor.fetchone() else f"CREATE SCHEMA IF NOT EXISTS {SCHEMA};"
            # Replicas starting together: one creates, the others find the tables there.
            cursor.execute(
                f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK}, 0);{create_schema}{_TABLES}"
            )
            self._schema_ready = True


class PostgresShares:
    """A client's computations of one kind, counted in the database for every replica: a
    lease (a row) per computation, taken under a lock of the client's, lapsing ``ttl_s``
    seconds after it was taken (its replica crashed)."""

    blocking = True

    def __init__(self, store: PostgresLimits, what: str, *, ttl_s: float) -> None:
        self.what = what
        self.ttl_s = ttl_s
        self._store = store

    def take(self, client: str, share: int) -> Lease | None:
        parameters = {"what": self.what, "client": client, "ttl_s": self.ttl_s, "share": share}

        def take(cursor: Cursor) -> int | None:
            cursor.execute(_TAKE_LEASE, parameters)
            row = cursor.fetchone()
            return None if row is None else int(row[0])

        leased = self._store.run(take)
        return None if leased is None else Lease(self.what, client, leased)

    def give_back(self, lease: Lease) -> None:
        self._store.run(
            lambda cursor: cursor.execute(
                f"DELETE FROM {SCHEMA}.leases WHERE id = %(id)s", {"id": lease.id}
            )
        )


class PostgresBackoffs:
    """The SQL back-off of every replica, timed by the database's clock."""

    def __init__(self, store: PostgresLimits, policy: ClientBackoff) -> None:
        self.policy = policy
        self._store = store

    def wait_s(self, client: str) -> float:
        row = self._one(_BACKOFF_WAIT, client)
        return 0.0 if row is None else float(row[0])

    def strikes(self, client: str) -> int:
        row = self._one(_BACKOFF_STRIKES, client)
        return 0 if row is None else self.policy.remaining(int(row[0]), float(row[1]))

    def strike(self, client: str, strikes: int) -> float:
        def strike(cursor: Cursor) -> float:
            cursor.execute(_BACKOFF_READ_FOR_STRIKE, {"client": client})
            now, before, struck_at = cast(tuple[dt.datetime, Any, Any], cursor.fetchone())
            left = (
                0
                if before is None
                else self.policy.remaining(int(before), (now - struck_at).total_seconds())
            )
            total = left + strikes
            pause_s = self.policy.pause_s(total)
            cursor.execute(
                _BACKOFF_WRITE_STRIKE,
                {
                    "client": client,
                    "strikes": total,
                    "now": now,
                    "pause_s": pause_s,
                    # Housekeeping: the rows of clients whose strikes are all forgiven.
                    "forgive_s": self.policy.forgive_s,
                },
            )
            return pause_s

        return self._store.run(strike)

    def _one(self, query: str, client: str) -> tuple[Any, ...] | None:
        def one(cursor: Cursor) -> tuple[Any, ...] | None:
            cursor.execute(query, {"client": client})
            return cursor.fetchone()

        return self._store.run(one)


def _unreachable(exc: psycopg2.Error) -> str:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return (
        "the store of the limits the API's replicas share (API_LIMITS_URL) did not answer: "
        f"{reason}; requests counted against a key's limits are refused until it does"
    )


def _in_transaction(connection: psycopg2.extensions.connection) -> bool:
    status = connection.info.transaction_status
    return bool(status != psycopg2.extensions.TRANSACTION_STATUS_IDLE)


def _roll_back(connection: psycopg2.extensions.connection) -> None:
    with contextlib.suppress(psycopg2.Error), connection.cursor() as cursor:
        cursor.execute("ROLLBACK")


def _usable(connection: psycopg2.extensions.connection) -> bool:
    status = connection.info.transaction_status
    return bool(connection.closed == 0 and status == psycopg2.extensions.TRANSACTION_STATUS_IDLE)
