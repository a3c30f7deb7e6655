"""The PostgreSQL endpoint's listener (:mod:`api.pg_wire`): pg-mimic's server with TLS (the
SSLRequest answered and the stream upgraded, or plain text refused when TLS is required),
a deadline for the start-up, messages bounded before their body is read, and caps on
connections in all and per address."""

from __future__ import annotations

import asyncio
import functools
import ssl
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from pg_mimic import PgServer
from pg_mimic import messages as pg_messages
from pg_mimic.stream import ConnectionClosed, PgStream

from api.settings import ApiSettings

# What clients read from server_version: pgJDBC, SQLAlchemy and Grafana parse a major version.
SERVER_VERSION: Final = "16.0 (ctr-lambda)"
_PROTOCOL_3: Final = 196608
_MAX_STARTUP_BYTES: Final = 10_000


def tls_context(settings: ApiSettings) -> ssl.SSLContext | None:
    """The server's TLS context from ``API_PG_TLS_CERT`` and ``API_PG_TLS_KEY`` (None
    without them)."""
    if settings.pg_tls_cert is None or settings.pg_tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.pg_tls_cert, settings.pg_tls_key)
    return context


class Listener(PgServer):
    """pg-mimic's server with TLS, a start-up deadline, bounded messages and connection
    limits (``settings``' API_PG_* and API_HEADER_TIMEOUT_S); its refusals counted by reason."""

    def __init__(
        self,
        settings: ApiSettings,
        session_factory: Callable[[], Any],
        auth_plugin_factory: Callable[[str], Any],
    ) -> None:
        super().__init__(
            session_factory=session_factory,
            auth_plugin_factory=auth_plugin_factory,
            server_version=SERVER_VERSION,
        )
        self.settings = settings
        self.tls = tls_context(settings)
        self.open = 0
        self.per_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    async def _handle_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        client = peer(writer)
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
        settings = self.settings
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
        limit = int(self.settings.pg_max_message_bytes)
        stream.read_startup_packet = functools.partial(_read_startup_packet, stream)
        stream.read_message = functools.partial(_read_message, stream, limit, self.refused)
        try:
            async with asyncio.timeout(self.settings.header_timeout_s):
                return await self._startup(stream)
        except TimeoutError:
            self.refused["startup_timeout"] += 1
            return None

    async def _startup(self, stream: PgStream) -> dict[str, str] | None:
        tls = False
        code, payload = await stream.read_startup_packet()
        # GSSAPI encryption first (libpq's gssencmode=prefer), then TLS, then the startup.
        while code in (pg_messages.SSL_REQUEST_CODE, pg_messages.GSSENC_REQUEST_CODE):
            context = self.tls
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
            stream.write(fatal("08P01", f"unsupported protocol version {version}"))
            await stream.drain()
            return None
        # Refused here, after TLS: the client reads the reason.
        too_many = self._over_limit(peer(stream.writer))
        if too_many is not None:
            self.refused["too_many_connections"] += 1
            stream.write(fatal("53300", too_many))
            await stream.drain()
            return None
        if self.settings.pg_tls_required and not tls:
            self.refused["tls_required"] += 1
            stream.write(
                fatal(
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
            fatal(
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


def peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if peer else "unknown"


def fatal(sqlstate: str, message: str) -> bytes:
    return pg_messages.make_error_response(
        {"S": "FATAL", "V": "FATAL", "C": sqlstate, "M": message}
    )
