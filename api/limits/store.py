"""What the API's replicas count together: the interface of a limits store.

A key's share of the CTR and SQL workers (:class:`KeyShares`), the SQL back-off
(:class:`~serving_layer.sandbox.backoff.BackoffBook`) and the keys' last uses
(:class:`~access.key_usage.KeyUseRecorder`) are counted by one :class:`LimitsStore`: in the
process (:class:`api.limits.local.LocalLimits`, one replica) or in PostgreSQL
(:class:`api.limits.postgres.PostgresLimits`, any number). What is truly local — the workers,
the queue, memory, the edge's connections — stays with each process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from access.key_usage import KeyUseRecorder
from lake.settings import LakeSettings
from serving_layer.sandbox.backoff import BackoffBook, ClientBackoff


@dataclass(frozen=True)
class Lease:
    """One computation of ``client``'s counted against its share of ``what``."""

    what: str
    client: str
    id: int


class KeyShares(Protocol):
    """How many computations of one kind (``what``: "ctr", "sql") each client runs at once,
    counted wherever the store counts (all the replicas, or this process)."""

    what: str

    @property
    def blocking(self) -> bool:
        """Whether :meth:`take` and :meth:`give_back` wait for the network (call them from a
        thread, not an event loop)."""
        ...

    def take(self, client: str, share: int) -> Lease | None:
        """A lease for one more computation of ``client``'s, or None when it already has
        ``share`` running."""
        ...

    def give_back(self, lease: Lease) -> None:
        """The leased computation has ended."""
        ...


class LimitsStore(Protocol):
    """Where the limits that must hold for every replica are counted."""

    @property
    def shared(self) -> bool:
        """Whether other processes count with this one (the refusals say "across the API's
        replicas")."""
        ...

    def shares(self, what: str, *, longest_s: float) -> KeyShares:
        """Shares of the computations ``what``; one runs at most ``longest_s`` seconds (its
        time limits): a lease older than that is a crashed process's, and lapses."""
        ...

    def backoffs(self, policy: ClientBackoff, clock: Callable[[], float]) -> BackoffBook:
        """The SQL back-off under ``policy``; ``clock`` times it where the store keeps it in
        the process (a database keeps its own time)."""
        ...

    def key_uses(self, lake: LakeSettings, flush_s: float) -> KeyUseRecorder:
        """Where keys' last uses go, committed to ``lake``'s key store at most once per
        ``flush_s`` seconds (by one replica for all of them when the store is shared)."""
        ...

    def check(self) -> None:
        """Reach the store and create what it keeps if it is missing;
        :class:`~api.errors.LimitsUnavailableError` if it does not answer."""
        ...

    def close(self) -> None:
        """Let go of what the store holds (connections)."""
        ...
