"""Keys' last uses, recorded for every replica by one: each replica writes its uses to the
limits store every few seconds (a cheap upsert), and the one replica elected at a time commits
those not committed yet to ``access/keys`` once per ``API_KEY_USE_FLUSH_S``. So the key store
gets one commit per interval for the whole deployment, not one per replica, and the replicas
reload their keys (:class:`~access.key_watcher.KeyWatcher`) as seldom.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import TYPE_CHECKING

from access.key_store import checked_utc, record_use
from lake.settings import LakeSettings

if TYPE_CHECKING:
    from api.limits.postgres import PostgresLimits

log = logging.getLogger("ctr.keys")


class SharedKeyUses:
    """:meth:`touch` on each request (in memory); a background thread that, every
    ``store.push_s`` seconds, writes the uses touched meanwhile to ``store`` and, when this
    replica is elected, commits the deployment's pending uses to ``lake``'s key store.

    A failure (the store or the lake unreachable) is logged; the uses wait for the next round.
    :meth:`close` writes this replica's last uses to the store, where the next elected replica
    finds them (committing them at once would make a commit per replica per restart)."""

    def __init__(self, store: PostgresLimits, lake: LakeSettings, *, flush_s: float) -> None:
        if flush_s <= 0:
            raise ValueError(f"flush_s must be positive, got {flush_s}")
        self.lake = lake
        self.flush_s = flush_s
        self._store = store
        self._touched: dict[str, dt.datetime] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="key-usage", daemon=True)
        self._thread.start()

    def touch(self, name: str, at: dt.datetime) -> None:
        """``name``'s key was used at ``at``."""
        checked_utc(at, "at")
        with self._lock:
            self._keep(name, at)

    def push(self) -> None:
        """Write the uses touched since the last push to the store."""
        with self._lock:
            used, self._touched = self._touched, {}
        try:
            self._store.push_key_uses(used)
        except Exception:
            log.exception("keeping %d key(s)' last use in the limits store failed", len(used))
            with self._lock:
                for name, at in used.items():
                    self._keep(name, at)

    def commit_if_elected(self) -> int:
        """Commit the deployment's pending uses to the lake if this replica is elected and the
        last commit is ``flush_s`` old; the number of keys committed."""
        try:
            return self._store.commit_key_uses(self.flush_s, self._commit)
        except Exception:
            log.exception("committing keys' last uses failed; the next round retries")
            return 0

    def close(self) -> None:
        """Stop the background thread, and push once more."""
        self._closed.set()
        self._thread.join()
        self.push()

    def _commit(self, used: dict[str, dt.datetime]) -> None:
        record_use(self.lake, used)

    def _keep(self, name: str, at: dt.datetime) -> None:
        last = self._touched.get(name)
        if last is None or at > last:
            self._touched[name] = at

    def _run(self) -> None:
        while not self._closed.wait(self._store.push_s):
            self.push()
            self.commit_if_elected()
