"""A table's file list kept current from the new commits of its Delta log, without a reload.

A served table gets a commit every second (``speed/ctr``) and holds thousands of files at a
billion events a day. Reloading it through delta-rs per refresh (``update_incremental`` then
``file_uris()``) lists the log and rebuilds the whole list of every file; here a refresh reads
only what is new: the JSON file of the next version (one request, usually answered "not
found"), and the next while there are more.
Its ``add`` and ``remove`` actions patch the list.

A commit this cannot follow — new metadata (schema or partitioning), a new protocol, a file with
a deletion vector — or a commit file missing (cleaned up past the retention while nobody
looked) makes the caller reload the table whole: :class:`NeedsReload`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from serving_layer.delta_log import DeltaLog

# Actions that change what a plain scan of the file list would read other than by adding and
# removing files: the table must be read again by delta-rs.
_RELOAD_ACTIONS: Final = frozenset({"metaData", "protocol"})
# The most commits one refresh follows; past it the table is reloaded whole (cheaper than
# replaying a long log a file at a time).
MAX_COMMITS: Final = 100


class NeedsReload(Exception):
    """The new commits cannot be applied to the file list: reload the table (the reason)."""


@dataclass(frozen=True)
class Tail:
    """What the new commits after a version did: the last version read and the file list
    patched (``files`` unchanged and ``version`` the same: nothing new)."""

    version: int
    files: tuple[str, ...]
    # Object-store requests made: a GET per commit found, then one that finds nothing (on S3 a
    # HEAD answered 404: the usual single request).
    requests: int


def follow(
    log: DeltaLog, root: str, version: int, files: Iterable[str], *, limit: int = MAX_COMMITS
) -> Tail:
    """The file list of the table at ``root`` after the commits that follow ``version``, from
    ``files`` (its list at ``version``, as :func:`file_uri` spells them). Raises
    :class:`NeedsReload` when a commit cannot be applied or more than ``limit`` follow."""
    requests = 0
    current: dict[str, None] | None = None
    last = version
    while True:
        requests += 1
        actions = read_commit(log, last + 1)
        if actions is None:
            break
        if last - version >= limit:
            raise NeedsReload(f"more than {limit} new commits")
        if current is None:
            current = dict.fromkeys(files)
        _apply(current, actions, root)
        last += 1
    patched = tuple(files) if current is None else tuple(sorted(current))
    return Tail(last, patched, requests)


def read_commit(log: DeltaLog, version: int) -> list[dict[str, object]] | None:
    """The actions of ``version``'s commit file, or None if there is none (yet)."""
    try:
        with log.filesystem.open_input_stream(f"{log.path}/{version:020d}.json") as stream:
            text = stream.read().decode()
    except FileNotFoundError:
        return None
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise NeedsReload(f"version {version}'s commit is not JSON lines: {exc}") from None


def file_uri(root: str, path: str) -> str:
    """The URI of a file an ``add`` or ``remove`` action names, as delta-rs' ``file_uris()``
    spells it: the path percent-decoded once, under the table's root (unless absolute)."""
    decoded = unquote(path)
    if "://" in path:
        return decoded
    return f"{root.rstrip('/')}/{decoded}"


def _apply(files: dict[str, None], actions: list[dict[str, object]], root: str) -> None:
    for action in actions:
        if changed := _RELOAD_ACTIONS & action.keys():
            raise NeedsReload(f"a commit changes the table's {', '.join(sorted(changed))}")
        if (added := action.get("add")) is not None:
            add = _fields(added)
            if add.get("deletionVector"):
                raise NeedsReload("a file with a deletion vector")
            files[file_uri(root, str(add["path"]))] = None
        elif (removed := action.get("remove")) is not None:
            files.pop(file_uri(root, str(_fields(removed)["path"])), None)


def _fields(action: object) -> dict[str, object]:
    if not isinstance(action, dict) or not isinstance(action.get("path"), str):
        raise NeedsReload(f"an action without a path: {action!r:.200}")
    return action
