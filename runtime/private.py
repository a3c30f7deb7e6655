"""Files of the platform that only their owner reads: the lake holds every raw event (user ids
included) past every API scope, and the run directory holds the broker's data, credentials and
Airflow's database.

At each entry point (``ctr``, and the shell scripts of ``infra/`` with ``umask 077``) the
process's umask becomes owner-only (``CTR_UMASK``, default ``077``) before anything is
created, so whatever it and its children create (delta-rs's files, the broker's logs, Spark's
through Hadoop's ``fs.permissions.umask-mode``, which :mod:`runtime.spark` sets to the same)
is owner-only; and what already exists (a lake or run directory made before) is closed too:
the lake's roots entirely (:func:`owner_only`), so no other local user can enter them whatever
the modes inside, and the run directory down to its first level (:func:`close_run_dir`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

DEFAULT_UMASK: Final = 0o077


def umask_setting(environ: Mapping[str, str]) -> int:
    """``CTR_UMASK`` of ``environ`` (octal, e.g. ``077`` or ``027``), default ``077``."""
    return parse_umask(environ.get("CTR_UMASK", ""))


def parse_umask(text: str) -> int:
    """A ``CTR_UMASK`` value (octal text; empty: the default ``077``)."""
    text = text.strip()
    if not text:
        return DEFAULT_UMASK
    try:
        value = int(text, 8)
    except ValueError:
        raise ValueError(f"CTR_UMASK must be an octal umask like 077, got {text!r}") from None
    if not 0 <= value <= 0o777:
        raise ValueError(f"CTR_UMASK must be an octal umask like 077, got {text!r}")
    return value


def owner_only(roots: Iterable[str | Path | None], mask: int = DEFAULT_UMASK) -> None:
    """Set the process's umask to ``mask`` and take the permissions ``mask`` denies away from
    each local directory of ``roots`` that exists (object-store URIs and None are skipped)."""
    os.umask(mask)
    for root in roots:
        if root is None or "://" in str(root):
            continue
        path = Path(root)
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if path.is_dir() and mode & mask:
            try:
                path.chmod(mode & ~mask)
            except PermissionError:  # another user's directory: theirs to set
                continue


# Under RUN_DIR, infra/postgres.sh's folder: run as root, PostgreSQL runs as its own user, who
# must pass through RUN_DIR to its data (which postgres.sh keeps owner-only itself).
_RUN_DIR_SHARED: Final = frozenset({"postgres"})


def close_run_dir(run_dir: str | Path | None, mask: int = DEFAULT_UMASK) -> None:
    """Close the run directory to other users: no listing it (others may still pass through
    it, for the private PostgreSQL's user), and every file and folder directly in it, but
    PostgreSQL's, owner-only; so what an earlier version left readable below it is closed
    whatever its own mode, at the cost of one folder's entries."""
    if run_dir is None:
        return
    root = Path(run_dir)
    if not root.is_dir():
        return
    _take_away(root, mask & 0o666)
    for entry in root.iterdir():
        if entry.name not in _RUN_DIR_SHARED and not entry.is_symlink():
            _take_away(entry, mask)


def _take_away(path: Path, bits: int) -> None:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & bits:
            path.chmod(mode & ~bits)
    except (FileNotFoundError, PermissionError):  # gone, or another user's to set
        return
