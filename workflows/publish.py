"""Switching readers between versions of a view: review a built version against the published
one, publish it (refused until it has caught up), roll back. `ctr views diff/publish/rollback`
and the ``ctr_reprocess`` DAG's review and publish steps.

Publishing is one commit to ``views/registry``: every reader (the API, the SQL sandbox, the
dashboard) switches at its next snapshot.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from lake.coverage.model import Coverage
from lake.registry import RegistryEvent, read_registry, record
from lake.settings import LakeSettings
from runtime.times import EARLIEST, LATEST
from serving_layer.diff import diff_versions
from serving_layer.reader import SnapshotReader
from views.comparison import Comparison
from views.definitions import Definition
from workflows.build import missing
from workflows.errors import WorkflowError


class NotCaughtUpError(WorkflowError, ValueError):
    """The version does not cover everything the published version covers."""

    def __init__(self, target: Definition, current: Definition, missing: Coverage) -> None:
        first = missing.intervals[0]
        super().__init__(
            f"{target.key} does not cover {len(missing.intervals)} interval(s) that "
            f"v{current.version} covers (from {first.start:%Y-%m-%d %H:%M} UTC): build it first "
            f"(`ctr views build {target.view} --version {target.version}`)"
        )
        self.missing = missing


@dataclass(frozen=True)
class Switch:
    """What a publish or a rollback did: ``event`` None when ``target`` was published already."""

    target: Definition
    previous: Definition
    event: RegistryEvent | None


def publish(lake: LakeSettings, target: Definition, reason: str, *, force: bool = False) -> Switch:
    """Publish ``target``; :class:`NotCaughtUpError` while it does not cover what the published
    version covers, unless ``force``."""
    current = read_registry(lake).published(target.view)
    if current == target:
        return Switch(target, current, None)
    gaps = missing(lake, target)
    if gaps.intervals and not force:
        raise NotCaughtUpError(target, current, gaps)
    return Switch(target, current, record(lake, target.view, target.version, "published", reason))


def rollback(lake: LakeSettings, view: str, reason: str) -> Switch | None:
    """Publish again the version of ``view`` published before the current one (None: there
    is none)."""
    registry = read_registry(lake)
    current, previous = registry.published(view), registry.previous(view)
    if previous is None:
        return None
    event = record(lake, view, previous.version, "published", f"rollback: {reason}")
    return Switch(previous, current, event)


def diff(
    lake: LakeSettings,
    a: Definition,
    b: Definition,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> Comparison:
    """Version ``a`` against version ``b`` over [start, end) (default: all time), as readers
    would see them, in one snapshot of the lake."""
    reader = SnapshotReader(lake, refresh_s=0)
    try:
        return diff_versions(reader, a, b, start=start or EARLIEST, end=end or LATEST)
    finally:
        reader.close()


def review(
    lake: LakeSettings, target: Definition, max_changed_fraction: float
) -> tuple[Comparison, bool]:
    """``target`` against the published version over all time, and whether the share of rows
    that change is within ``max_changed_fraction`` (publish without a human)."""
    published = read_registry(lake).published(target.view)
    result = diff(lake, published, target)
    return result, result.changed_fraction <= max_changed_fraction
