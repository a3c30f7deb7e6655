"""Keys' last uses: kept in memory on each request by :class:`UsageRecorder` and committed to
``access/keys`` (``used`` events, :func:`access.key_store.record_use`) at most once a minute per
API process. The maintenance pass drops the ones a later use supersedes
(:func:`lake.maintenance.fold_key_uses`).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Protocol

from access.key_store import checked_utc, record_use
from lake.settings import LakeSettings

log = logging.getLogger("ctr.keys")


class KeyUseRecorder(Protocol):
    """Where the API records its keys' last uses (:class:`UsageRecorder`, or one that the
    API's replicas share)."""

    def touch(self, name: str, at: dt.datetime) -> None:
        """``name``'s key was used at ``at`` (cheap: called on every request)."""
        ...

    def close(self) -> None:
        """Stop recording, and pass on what was touched."""
        ...


class UsageRecorder:
    """Last uses of keys: :meth:`touch` on each request (in memory), and a background thread
    that commits the latest use of each key touched every ``flush_s`` seconds (one commit, none
    when nothing was touched). A failed commit is logged and its uses wait for the next."""

    def __init__(self, lake: LakeSettings, flush_s: float = 60.0) -> None:
        if flush_s <= 0:
            raise ValueError(f"flush_s must be positive, got {flush_s}")
        self.lake = lake
        self.flush_s = flush_s
        self._touched: dict[str, dt.datetime] = {}
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="key-usage", daemon=True)
        self._thread.start()

    def touch(self, name: str, at: dt.datetime) -> None:
        """``name``'s key was used at ``at``."""
        checked_utc(at, "at")
        with self._lock:
            self._keep(name, at)

    def flush(self) -> None:
        """Commit the uses touched since the last flush."""
        with self._flushing:
            with self._lock:
                used, self._touched = self._touched, {}
            try:
                record_use(self.lake, used)
            except Exception:
                log.exception("recording %d key(s)' last use failed; next flush retries", len(used))
                with self._lock:
                    for name, at in used.items():
                        self._keep(name, at)

    def close(self) -> None:
        """Stop the background thread, and flush once more."""
        self._closed.set()
        self._thread.join()
        self.flush()

    def _keep(self, name: str, at: dt.datetime) -> None:
        last = self._touched.get(name)
        if last is None or at > last:
            self._touched[name] = at

    def _run(self) -> None:
        while not self._closed.wait(self.flush_s):
            self.flush()
