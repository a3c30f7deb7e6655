"""The views over PostgreSQL's wire protocol: ``ctr serve``'s second port (``API_PG_PORT``), for
``psql``, BI tools (DBeaver, Grafana, Superset, Metabase: pgJDBC, libpq, psycopg) and notebooks.

The protocol is pg-mimic's (messages, the simple and extended query protocols, prepared
statements and portals, ``SET``/``SHOW``, transactions, and the ``information_schema`` and
``pg_catalog`` tables clients read to list tables, built from what :meth:`_Session.schema`
declares, never DuckDB's own catalog). What a query does is ``POST /api/v1/sql``'s, by the same
objects of the same process:

- **the key is the password** (``AuthenticationCleartextPassword``; the user name is free), checked
  as a bearer key is (:class:`api.authn.Authenticator`: API_TOKEN or a live key of the key
  store), and checked again before each query, so a revoke or an expiry takes effect on open
  connections too;
- each query is the sandbox's (:class:`serving_layer.sandbox.pool.SqlPool`): one read-only
  statement over the views the key may read, its parameters bound by DuckDB (``$1``…), the same
  row, byte, time and memory limits, the key's share of the workers (the API's SQL gate, counted
  across replicas with ``API_LIMITS_URL``) and its back-off; over the snapshot the HTTP API
  serves at that moment;
- refusals and failures reach the client as PostgreSQL errors with SQLSTATE codes and the
  sandbox's message (:func:`pg_error`); the connection stays usable;
- an answer cut off at a limit comes with a warning (a NoticeResponse) saying so.

TLS: with ``API_PG_TLS_CERT`` and ``API_PG_TLS_KEY`` a client's SSLRequest is accepted
(``sslmode=require``); with ``API_PG_TLS_REQUIRED`` a connection that does not ask for TLS is
refused before its password is sent. Connections: at most ``API_PG_MAX_CONNECTIONS`` open, of
them ``API_PG_MAX_CONNECTIONS_PER_CLIENT`` from one address, and the start-up (TLS, the
startup message, the password) within ``API_HEADER_TIMEOUT_S``.

pg-mimic is pinned (``pg-mimic==0.1.3``): the TLS upgrade and the connection limits override its
start-up (``_negotiate_startup``, ``_handle_client``), which its tests here exercise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import struct
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Final

from anyio import CapacityLimiter, to_thread
from pg_mimic import PgServer, Session
from pg_mimic import messages as pg_messages
from pg_mimic.auth import AuthPlugin, IdentityProvider
from pg_mimic.errors import PgError
from pg_mimic.session import CallbackStatement, Statement
from pg_mimic.stream import ConnectionClosed, PgStream
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from access.roles import Access
from api.authn import Authenticator
from api.pg_catalog import (
    CatalogStatement,
    catalog_query,
    savepoint_statement,
    show_statement,
    version_statement,
)
from api.pg_prepared import prepared_statement
from api.pg_statements import SandboxStatement, pg_error
from api.pg_types import pg_type
from api.query_gate import QueryGate
from api.settings import ApiSettings
from api.versions import snapshot_at_least
from runtime.object_store import ObjectStoreSettings
from serving_layer.sandbox.database import (
    SqlResult,
    view_columns,
)
from serving_layer.sandbox.pool import SqlPool
from serving_layer.service import ServingLayer

_access_log = logging.getLogger("ctr.access")
# What clients read from server_version: pgJDBC, SQLAlchemy and Grafana parse a major version.
SERVER_VERSION: Final = "16.0 (ctr-lambda)"
_PROTOCOL_3: Final = 196608
_MAX_STARTUP_BYTES: Final = 10_000


class PgWire:
    """The PostgreSQL endpoint of one API process: started and stopped by the application's
    lifespan, on its event loop, over its key check, snapshots, SQL pool and gate."""

    def __init__(
        self,
        settings: ApiSettings,
        *,
        authenticator: Authenticator,
        serving: ServingLayer,
        pool: SqlPool,
        gate: QueryGate,
        limiter: CapacityLimiter,
        store: ObjectStoreSettings,
    ) -> None:
        self.settings = settings
        self.store = store
        self.authenticator = authenticator
        self.serving = serving
        self.pool = pool
        self.gate = gate
        self.limiter = limiter
        self.tls = tls_context(settings)
        # Who each authenticated connection is, until its session takes it.
        self.logins: weakref.WeakKeyDictionary[PgStream, tuple[str, Access]] = (
            weakref.WeakKeyDictionary()
        )
        self._server = _Server(self)
        self.port: int | None = None

    async def start(self) -> None:
        host = self.settings.pg_host or self.settings.host
        server = await self._server.start_server(host=host, port=self.settings.pg_port)
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), timeout=5)

    @property
    def open_connections(self) -> int:
        return self._server.open

    @property
    def refused_connections(self) -> Counter[str]:
        return self._server.refused


class PgWireCollector(Collector):
    """``ctr_api_pg_open_connections`` and ``ctr_api_pg_refused_connections_total{reason}``
    (too many connections, TLS required, a wrong key, the start-up too slow)."""

    def __init__(self, wire: PgWire) -> None:
        self._wire = wire

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "ctr_api_pg_open_connections",
            "open connections of the PostgreSQL endpoint (API_PG_PORT)",
            value=self._wire.open_connections,
        )
        refused = CounterMetricFamily(
            "ctr_api_pg_refused_connections",
            "PostgreSQL connections refused before their first query, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(self._wire.refused_connections.copy().items()):
            refused.add_metric([reason], count)
        yield refused


def tls_context(settings: ApiSettings) -> ssl.SSLContext | None:
    """The server's TLS context from ``API_PG_TLS_CERT`` and ``API_PG_TLS_KEY`` (None
    without them)."""
    if settings.pg_tls_cert is None or settings.pg_tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.pg_tls_cert, settings.pg_tls_key)
    return context


class _Server(PgServer):
    """pg-mimic's server with TLS, a start-up deadline and connection limits."""

    def __init__(self, wire: PgWire) -> None:
        super().__init__(
            session_factory=lambda: _Session(wire),
            auth_plugin_factory=lambda _user: _KeyAuth(wire),
            server_version=SERVER_VERSION,
        )
        self.wire = wire
        self.open = 0
        self.per_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    async def _handle_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        client = _peer(writer)
        self.open += 1
        self.per_client[client] += 1
        try:
            await super()._handle_client(reader, writer)
        finally:
            self.open -= 1
            self.per_client[client] -= 1
            if not self.per_client[client]:
                del self.per_client[client]

    def _over_limit(self, client: str) -> str | None:
        """Why a new connection from ``client`` (counted already) is one too many, or None."""
        settings = self.wire.settings
        if self.open > settings.pg_max_connections:
            return (
                "the server has too many connections "
                f"(API_PG_MAX_CONNECTIONS={settings.pg_max_connections})"
            )
        if self.per_client[client] > settings.pg_max_connections_per_client:
            return (
                f"too many connections from {client} "
                f"(API_PG_MAX_CONNECTIONS_PER_CLIENT={settings.pg_max_connections_per_client})"
            )
        return None

    async def _negotiate_startup(self, stream: PgStream) -> dict[str, str] | None:
        # Every message of the connection bounded, the password's included.
        limit = int(self.wire.settings.pg_max_message_bytes)
        stream.read_startup_packet = functools.partial(_read_startup_packet, stream)
        stream.read_message = functools.partial(_read_message, stream, limit, self.refused)
        try:
            async with asyncio.timeout(self.wire.settings.header_timeout_s):
                return await self._startup(stream)
        except TimeoutError:
            self.refused["startup_timeout"] += 1
            return None

    async def _startup(self, stream: PgStream) -> dict[str, str] | None:
        tls = False
        code, payload = await stream.read_startup_packet()
        # GSSAPI encryption first (libpq's gssencmode=prefer), then TLS, then the startup.
        while code in (pg_messages.SSL_REQUEST_CODE, pg_messages.GSSENC_REQUEST_CODE):
            context = self.wire.tls
            if code == pg_messages.SSL_REQUEST_CODE and context is not None and not tls:
                stream.write(b"S")
                await stream.drain()
                await stream.writer.start_tls(context)
                tls = True
            else:
                stream.write(b"N")
                await stream.drain()
            code, payload = await stream.read_startup_packet()
        if code == pg_messages.CANCEL_REQUEST_CODE:
            pid, secret = pg_messages.parse_cancel_request(payload)
            self.cancel(pid, secret)
            return None
        if code != _PROTOCOL_3:
            version = f"{code >> 16}.{code & 0xFFFF}"
            stream.write(_fatal("08P01", f"unsupported protocol version {version}"))
            await stream.drain()
            return None
        # Refused here, after TLS: the client reads the reason.
        too_many = self._over_limit(_peer(stream.writer))
        if too_many is not None:
            self.refused["too_many_connections"] += 1
            stream.write(_fatal("53300", too_many))
            await stream.drain()
            return None
        if self.wire.settings.pg_tls_required and not tls:
            self.refused["tls_required"] += 1
            stream.write(
                _fatal(
                    "28000",
                    "this server accepts TLS connections only (API_PG_TLS_REQUIRED): connect "
                    "with sslmode=require",
                )
            )
            await stream.drain()
            return None
        return pg_messages.parse_startup_message(payload)


async def _read_startup_packet(stream: PgStream) -> tuple[int, bytes]:
    """pg-mimic's read of a start-up packet, bounded as PostgreSQL's (10,000 bytes)."""
    header = await _exactly(stream, 8)
    length, code = struct.unpack("!ii", header)
    if not 8 <= length <= _MAX_STARTUP_BYTES:
        raise ConnectionClosed
    return code, await _exactly(stream, length - 8)


async def _read_message(stream: PgStream, limit: int, refused: Counter[str]) -> tuple[bytes, bytes]:
    """pg-mimic's read of a message, refused past ``limit`` bytes (API_PG_MAX_MESSAGE_BYTES)
    before its body is read: a query's text is parsed on the event loop."""
    header = await _exactly(stream, 5)
    tag, length = header[:1], struct.unpack("!i", header[1:])[0]
    if length < 4:
        raise ConnectionClosed
    if length - 4 > limit:
        refused["message_too_large"] += 1
        stream.write(
            _fatal(
                "54000",
                f"a message of {length - 4} bytes, over API_PG_MAX_MESSAGE_BYTES ({limit})",
            )
        )
        await stream.drain()
        raise ConnectionClosed
    return tag, await _exactly(stream, length - 4)


async def _exactly(stream: PgStream, size: int) -> bytes:
    try:
        return await stream.reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ConnectionClosed from None


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if peer else "unknown"


def _fatal(sqlstate: str, message: str) -> bytes:
    return pg_messages.make_error_response(
        {"S": "FATAL", "V": "FATAL", "C": sqlstate, "M": message}
    )


class _KeyAuth(AuthPlugin):
    """The password is an API key (or API_TOKEN), checked as a bearer key; the user name is
    free. A wrong, revoked or expired key fails as a wrong password does (SQLSTATE 28P01)."""

    def __init__(self, wire: PgWire) -> None:
        self.wire = wire

    async def authenticate(
        self, stream: PgStream, username: str, identity_provider: IdentityProvider
    ) -> bool:
        stream.write(pg_messages.make_authentication_cleartext_password())
        await stream.drain()
        try:
            async with asyncio.timeout(self.wire.settings.header_timeout_s):
                tag, payload = await stream.read_message()
        except TimeoutError:
            self.wire.refused_connections["startup_timeout"] += 1
            raise ConnectionClosed from None
        if tag != pg_messages.PASSWORD:
            raise ConnectionClosed
        key = payload.rstrip(b"\x00").decode("utf-8", errors="replace")
        access = await self.wire.authenticator.access(f"Bearer {key}")
        if access is None:
            self.wire.refused_connections["wrong_key"] += 1
            return False
        self.wire.logins[stream] = (key, access)
        return True


class _Session(Session):
    """One connection: its key, what the key may read, and its queries through the sandbox."""

    def __init__(self, wire: PgWire) -> None:
        self.wire = wire
        self.key = ""
        self.access: Access | None = None
        # SQL's PREPARE'd queries by name (the protocol's own are pg-mimic's).
        self.prepared: dict[str, str] = {}

    async def init(self, connection: Any) -> None:
        await super().init(connection)
        self.key, self.access = self.wire.logins.pop(connection.stream)

    @property
    def settings(self) -> ApiSettings:
        return self.wire.settings

    @property
    def connection(self) -> Any:
        """pg-mimic's connection (its stream, transaction state, session variables)."""
        return self._connection

    @property
    def client(self) -> str:
        """Whom the SQL gate's shares and the back-off count: the key, as over HTTP."""
        assert self.access is not None
        return f"key:{self.access.name}"

    async def schema(self) -> dict[str, dict[str, str]]:
        """The views the key may read and their columns, as the catalog tables list them."""
        columns = view_columns(self.wire.store, self.access)
        return {
            view: {name: pg_type(kind).name for name, kind in fields}
            for view, fields in columns.items()
        }

    async def prepare(self, sql: str, param_oids: list[int | None]) -> Statement:
        answered = self._answered_here(sql, param_oids)
        if answered is not None:
            return answered
        statement = await super().prepare(sql, param_oids)
        if isinstance(statement, CallbackStatement):
            return SandboxStatement(self, sql, param_oids)
        return statement  # the catalog, SET/SHOW, transactions, version(): pg-mimic's

    def _answered_here(self, sql: str, param_oids: list[int | None]) -> Statement | None:
        """What the endpoint answers itself (``version()``, savepoints, settings, the
        catalog) or sends to the sandbox past pg-mimic (DuckDB's ``SHOW TABLES``); None: ask
        pg-mimic, then the sandbox."""
        answered = (
            version_statement(sql)
            or prepared_statement(self, self.prepared, sql)
            or savepoint_statement(self._connection, sql)
        )
        if answered is not None:
            return answered
        show = show_statement(sql, view_columns(self.wire.store, self.access))
        if show is True:  # SHOW TABLES, SHOW <view>: DuckDB's, in the sandbox
            return SandboxStatement(self, sql, param_oids)
        if isinstance(show, Statement):
            return show
        catalog = catalog_query(sql)
        if catalog is not None:  # evaluated at Bind, with its parameters
            statement = CatalogStatement(self._connection, sql, catalog)
            statement.param_oids = param_oids
            return statement
        return None

    async def live_access(self) -> Access:
        """The key's access now: a revoked or expired key ends its connection's queries."""
        access = await self.wire.authenticator.access(f"Bearer {self.key}")
        if access is None:
            raise PgError(
                "28000", "the key is no longer valid (revoked or expired): connect with a live key"
            )
        self.access = access
        return access

    async def run(self, sql: str, params: Sequence[str | None]) -> SqlResult:
        """``sql`` with ``params`` in the sandbox, under ``POST /api/v1/sql``'s rules."""
        wire, settings = self.wire, self.wire.settings
        started = time.perf_counter()
        access = await self.live_access()
        client = self.client
        try:
            snapshot = await to_thread.run_sync(
                snapshot_at_least, wire.serving.reader.snapshots, {}
            )
            await to_thread.run_sync(wire.pool.check_backoff, client)
            run = functools.partial(
                wire.pool.run,
                sql,
                snapshot,
                max_rows=settings.sql_max_rows,
                max_bytes=int(settings.sql_max_bytes),
                timeout_s=settings.sql_timeout_s,
                client=client,
                access=access,
                params=params,
            )
            async with wire.gate.place(client):
                result = await to_thread.run_sync(run, limiter=wire.limiter)
        except Exception as exc:
            error = pg_error(exc)
            self._log(access, f"sqlstate={error.sqlstate}", started)
            raise error from None
        self._log(access, f"rows={len(result.rows)}", started)
        return result

    def _log(self, access: Access, outcome: str, started: float) -> None:
        """The access log's line of a query (logger ``ctr.access``, as HTTP requests'): the
        key's name (never the key), its role, the outcome; never the SQL."""
        if self.wire.settings.access_log:
            _access_log.info(
                "key=%s role=%s PG query %s ms=%.1f client=%s",
                access.name,
                access.role,
                outcome,
                (time.perf_counter() - started) * 1000,
                _peer(self.connection.stream.writer),
            )
