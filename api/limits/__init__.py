"""The limits the API's replicas count together: each key's share of the CTR and SQL workers,
the SQL back-off, the keys' last uses — in the process (one replica, :class:`LocalLimits`) or
in PostgreSQL (``API_LIMITS_URL``, :class:`PostgresLimits`). See :mod:`api.limits.store`."""

from __future__ import annotations

import logging

from anyio import to_thread

from api.errors import LimitsUnavailableError
from api.limits.local import LocalLimits
from api.limits.postgres import PostgresLimits
from api.limits.store import KeyShares, Lease, LimitsStore
from api.settings import ApiSettings

__all__ = [
    "KeyShares",
    "Lease",
    "LimitsStore",
    "LocalLimits",
    "PostgresLimits",
    "check_limits",
    "open_limits",
    "sql_longest_s",
]

log = logging.getLogger("ctr.limits")


def open_limits(settings: ApiSettings) -> LimitsStore:
    """The store ``settings`` name: PostgreSQL at ``API_LIMITS_URL``, else this process."""
    if settings.limits_url is None:
        return LocalLimits()
    return PostgresLimits(settings.limits_url)


def sql_longest_s(settings: ApiSettings) -> float:
    """How long a SQL query holds its key's share at most: its wait for a worker and its time
    limit (the store adds a margin for the kill's grace period and the answer's rendering)."""
    return settings.sql_queue_timeout_s + settings.sql_timeout_s


async def check_limits(store: LimitsStore) -> None:
    """Reach ``store`` as the API starts (creating its tables); if it does not answer, say so
    in the log and start all the same: until it answers, what it counts gets a 503."""
    try:
        await to_thread.run_sync(store.check)
    except LimitsUnavailableError as exc:
        log.warning("%s", exc)
