"""The keys as of ``access/keys``' latest commit, for the API's check on every request.

That check is cheap and never misses a revoke: :class:`KeyWatcher` keeps the keys of one table
version and, per call, one file stat (does the next version's log file exist?) says whether to
read them again. A revoke, by ``ctr keys revoke`` in any process sharing the lake, takes effect
at the API's next request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import pyarrow.fs as pafs

from access.key_ring import KeyRing
from access.key_store import read_keys_and_version
from lake.catalog import API_KEYS
from lake.settings import LakeSettings
from lake.storage import arrow_filesystem

# The shortest interval between two looks for a new commit, asked or not.
_LOOK_NOW_EVERY_S: Final = 0.1


@dataclass(frozen=True)
class _Loaded:
    version: int  # -1: no table yet
    ring: KeyRing
    at: float  # the watcher's clock


class KeyWatcher:
    """The keys as of the table's latest commit, for a check on every request.

    :meth:`ring` costs one file stat while nothing was committed: whether the log file of the
    version after the one read exists (a HEAD request on an object store,
    :attr:`check_is_remote`). A new commit (a create, a revoke, an API process's last uses, a
    compaction) reads the keys again. So does a ring older than ``max_age_s`` by ``clock``
    (seconds, monotonic): the log files of versions long past are cleaned up
    (``LAKE_HISTORY_RETENTION_HOURS``), after which the one the stat looks for could be gone.
    Errors (the store unreachable) are raised, never answered with the keys read before.
    With ``check_every_s``, the stat is made at most that often (a busy API would otherwise make
    one per request): a revoke takes effect within it.
    """

    def __init__(
        self,
        lake: LakeSettings,
        *,
        max_age_s: float = 600.0,
        check_every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        if check_every_s < 0:
            raise ValueError(f"check_every_s must be >= 0, got {check_every_s}")
        self.path = API_KEYS.path(lake)
        self.max_age_s = max_age_s
        self.check_every_s = check_every_s
        self.reloads = 0
        self.checks = 0  # stats made (object-store requests on an object store)
        self._checked_at = float("-inf")
        self._clock = clock
        self._remote = lake.on_object_store
        self._store = lake.object_store
        self._filesystem, root = arrow_filesystem(self.path, self._store)
        self._log = f"{root}/_delta_log"
        self._loaded: _Loaded | None = None
        self._lock = threading.Lock()

    @property
    def check_is_remote(self) -> bool:
        """Whether :meth:`ring`'s check is a network round trip (the lake on an object store):
        call it from a thread, not an event loop."""
        return self._remote

    def ring(self, *, look_now: bool = False) -> KeyRing:
        """The keys, read again only if the table has a commit they do not include.
        ``look_now``: look for one even within ``check_every_s`` (a key not found: perhaps one
        created since), at most every 0.1 s whatever the callers (unknown keys cannot make it
        look nonstop)."""
        seen = self._loaded
        if seen is not None and not self._stale(seen, look_now=look_now):
            return seen.ring
        with self._lock:
            loaded = self._loaded
            if loaded is seen:  # not read again by another thread meanwhile
                version, ring = read_keys_and_version(self.path, self._store)
                loaded = self._loaded = _Loaded(version, ring, self._clock())
                self.reloads += 1
            assert loaded is not None
            return loaded.ring

    def _stale(self, loaded: _Loaded, *, look_now: bool = False) -> bool:
        now = self._clock()
        if now - loaded.at >= self.max_age_s:
            return True
        interval = min(self.check_every_s, _LOOK_NOW_EVERY_S) if look_now else self.check_every_s
        if now - self._checked_at < interval:
            return False
        self._checked_at = now
        self.checks += 1
        # pyarrow, not delta-rs: it releases the GIL while it waits.
        info = self._filesystem.get_file_info(f"{self._log}/{loaded.version + 1:020d}.json")
        return bool(info.type != pafs.FileType.NotFound)
