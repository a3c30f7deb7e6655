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

TLS, the start-up's deadline, bounded messages and the connection caps are the listener's
(:mod:`api.pg_server`); SQL's ``PREPARE``/``EXECUTE`` :mod:`api.pg_prepared`'s; what a server
answers itself (``version()``, savepoints, the catalog) :mod:`api.pg_catalog`'s.

The protocol runs on an event loop of its own, in a thread: pg-mimic parses each statement with
sqlglot (pure Python), which must not hold the API's loop; each query and key check is handed to
the API's loop, where the SQL gate lives (:meth:`PgWire.on_api`).

pg-mimic is pinned (``pg-mimic==0.1.3``): the listener overrides its start-up
(``_negotiate_startup``, ``_handle_client``), which tests/integration/test_pg_wire.py exercises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from anyio import CapacityLimiter, to_thread
from pg_mimic import Session
from pg_mimic import messages as pg_messages
from pg_mimic.auth import AuthPlugin, IdentityProvider
from pg_mimic.errors import PgError
from pg_mimic.session import CallbackStatement, Statement
from pg_mimic.stream import ConnectionClosed, PgStream
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from access.roles import Access
from api import metric_catalog as catalog
from api.authn import Authenticator
from api.pg_catalog import (
    CatalogStatement,
    catalog_query,
    savepoint_statement,
    show_statement,
    version_statement,
)
from api.pg_prepared import prepared_statement
from api.pg_server import Listener, peer
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
T = TypeVar("T")


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
        # Who each authenticated connection is, until its session takes it.
        self.logins: weakref.WeakKeyDictionary[PgStream, tuple[str, Access]] = (
            weakref.WeakKeyDictionary()
        )
        self._server = Listener(
            settings,
            session_factory=lambda: _Session(self),
            auth_plugin_factory=lambda _user: _KeyAuth(self),
        )
        self.port: int | None = None
        self._api_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        """Listen, on an event loop of the endpoint's own in a thread: the protocol's work
        (parsing, the catalog's evaluation) never holds the API's loop; queries and key checks
        run on the API's loop (:meth:`on_api`), by its gate, limiter and pool."""
        self._api_loop = asyncio.get_running_loop()
        listening: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(listening,), name="pg-wire", daemon=True
        )
        self._thread.start()
        self.port = await asyncio.wrap_future(listening)

    def _serve(self, listening: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._stop = asyncio.Event()
            host = self.settings.pg_host or self.settings.host
            server = await self._server.start_server(host=host, port=self.settings.pg_port)
            self._loop = loop
            listening.set_result(server.sockets[0].getsockname()[1])
            await self._stop.wait()
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=5)

        try:
            loop.run_until_complete(serve())
        except BaseException as exc:
            if not listening.done():
                listening.set_exception(exc)
        finally:
            loop.close()

    async def close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            await to_thread.run_sync(self._thread.join, 10.0)

    async def on_api(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on the API's event loop (where the gate lives), awaited from the
        endpoint's; cancelling the wait cancels it."""
        assert self._api_loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._api_loop))

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
        yield catalog.PG_OPEN.family(self._wire.open_connections)
        refused = catalog.PG_REFUSED.family()
        for reason, count in sorted(self._wire.refused_connections.copy().items()):
            refused.add_metric([reason], count)
        yield refused


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
        access = await self.wire.on_api(self.wire.authenticator.access(f"Bearer {key}"))
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
        return await self.wire.on_api(self._run(sql, params))

    async def _run(self, sql: str, params: Sequence[str | None]) -> SqlResult:
        """:meth:`run`, on the API's event loop."""
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
                peer(self.connection.stream.writer),
            )
