"""Who sent a request: ``API_TOKEN`` (the bootstrap admin) or a key of the lake's key store.

Every request with a key reads the store's current state: one check for a new commit of
``access/keys`` (a stat of the next Delta log file), and a reload only when there is one, so a
revoke or an expiry takes effect on the next request and nothing is cached past it. Keys are
looked up by their SHA-256; the key itself is never stored, logged or kept.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from anyio import to_thread
from pydantic import SecretStr

from access.roles import BOOTSTRAP, Access

if TYPE_CHECKING:
    from access.key_usage import KeyUseRecorder
    from access.key_watcher import KeyWatcher


def utc_now() -> dt.datetime:
    """The system's time, in UTC: what keys' expiry is checked against outside tests."""
    return dt.datetime.now(dt.UTC)


def bearer(authorization: str | None) -> str | None:
    """The credentials of an ``Authorization: Bearer …`` header value, else None."""
    if authorization is None:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


def token_ok(expected: SecretStr, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header value carries the bearer token ``expected``."""
    credentials = bearer(authorization)
    return credentials is not None and secrets.compare_digest(
        credentials.encode(), expected.get_secret_value().encode()
    )


class Authenticator:
    """The :class:`~access.roles.Access` of a request's ``Authorization`` header, or None.

    ``watcher`` reads the key store (None: ``API_TOKEN`` only); ``usage`` records when each
    key was last used (set when the application starts); ``clock`` is the time keys' expiry is
    checked against."""

    def __init__(
        self,
        token: SecretStr,
        watcher: KeyWatcher | None = None,
        *,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.token = token
        self.watcher = watcher
        self.usage: KeyUseRecorder | None = None
        self._clock = clock

    async def access(self, authorization: str | None) -> Access | None:
        if token_ok(self.token, authorization):
            return BOOTSTRAP
        credentials = bearer(authorization)
        if credentials is None or self.watcher is None:
            return None
        if self.watcher.check_is_remote:
            # A round trip to the object store: not on the event loop.
            return await to_thread.run_sync(self.key_access, credentials)
        return self.key_access(credentials)

    def key_access(self, credentials: str) -> Access | None:
        """The access of key ``credentials`` if it is live now (blocking: reads the store)."""
        assert self.watcher is not None
        now = self._clock()
        key = self.watcher.ring().verify(credentials, now)
        if key is None:
            # Perhaps a key created since the last look (API_KEYS_CHECK_S): look now.
            key = self.watcher.ring(look_now=True).verify(credentials, now)
        if key is None:
            return None
        if self.usage is not None:
            self.usage.touch(key.name, now)
        return key.access
