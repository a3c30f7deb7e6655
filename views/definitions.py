"""The numbered versions of each view, as code: what every version counts.

A version is bound to its definition here, never to configuration: version 1 of ``ctr`` is the
base view of :mod:`views.ctr`; a later version is the base view over the events its ``where``
keeps. ``where`` is a predicate on the event dimensions in the SQL that Spark and DuckDB both
read, so the batch job applies it to events, and the serving layer to the speed layer's and the
late arrivals' rows (counted per dimensions, so the same filter keeps the same events).
Version 3 counts clicks differently: ``attribution`` is the window after an impression in
which a click is credited to it (:func:`views.ctr.attributed_ctr`), so ``clicks`` are the
impressions that were clicked, in the impression's bucket and dimensions, and the version has
the :data:`views.columns.ATTRIBUTION_MEASURES` as well. The window belongs to the version: a
deployment that needs another one adds a version with it here.
Engine-free: the CLI, the API and the DAGs read it without importing Spark.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Final

from views.errors import ViewError


class UnknownVersionError(ViewError, LookupError):
    """No definition of that view and version exists in code."""


@dataclass(frozen=True)
class Definition:
    view: str
    version: int
    summary: str
    where: str | None = None  # events (and view rows) the version counts; None: all
    # Clicks credited to their impression within this time after it; None: every click event
    # counts in its own bucket (versions 1 and 2).
    attribution: dt.timedelta | None = None
    # Events arriving up to this long after their minute are on time (the speed layer's
    # default watermark, SPEED_WATERMARK); later ones are late.
    lateness: dt.timedelta = dt.timedelta(minutes=10)

    @property
    def settle(self) -> dt.timedelta:
        """How long after a minute its rows can still change with on-time events: the
        lateness, and for a version with attribution the window too (a click up to the window
        after its impression changes the impression's minute). The batch layer covers a minute
        only once this has passed (:meth:`settled_before`), so only late events make a covered
        minute stale; the speed layer serves it until then."""
        return self.lateness + (self.attribution or dt.timedelta(0))

    def settled_before(self, now: dt.datetime) -> dt.datetime:
        """The first minute not settled at ``now``: every minute before it is."""
        edge = now.astimezone(dt.UTC) - self.settle
        return edge.replace(second=0, microsecond=0)

    @property
    def key(self) -> str:
        """How the lake names the version: ``ctr`` for version 1, ``ctr@v2`` after."""
        return self.view if self.version == 1 else f"{self.view}@v{self.version}"


DEFINITIONS: Final = (
    Definition("ctr", 1, "impressions and clicks per minute and ad dimensions, every event"),
    Definition(
        "ctr",
        2,
        "as version 1, without devices the ad servers could not classify (device_type 'other')",
        where="device_type <> 'other'",
    ),
    Definition(
        "ctr",
        3,
        "every event, clicks attributed to their impression within 1 hour: clicks <= impressions; "
        "raw, orphan and repeat clicks counted apart",
        attribution=dt.timedelta(hours=1),
    ),
)
# What a new lake publishes first (a lake with history keeps its version until a publish).
NEWEST: Final = {d.view: d.version for d in DEFINITIONS}


def definition(view: str, version: int) -> Definition:
    """The definition of ``view`` at ``version``, or :class:`UnknownVersionError` naming the
    versions that exist."""
    for candidate in DEFINITIONS:
        if (candidate.view, candidate.version) == (view, version):
            return candidate
    known = ", ".join(str(d.version) for d in DEFINITIONS if d.view == view)
    if not known:
        raise UnknownVersionError(f"no view named {view!r}; views: {', '.join(views())}")
    raise UnknownVersionError(f"{view} has no version {version}; its versions: {known}")


def versions(view: str) -> tuple[Definition, ...]:
    return tuple(d for d in DEFINITIONS if d.view == view)


def views() -> tuple[str, ...]:
    return tuple(dict.fromkeys(d.view for d in DEFINITIONS))
