"""views/registry: which version of each view is published, and what happened to every version.

An append-only Delta table of events — ``building``, ``ready``, ``published``, ``retired`` — each
with its time and reason. One event is one Delta commit, so a publish (or a rollback, which
publishes the version published before) switches every reader at once: a reader pins one
version of this table with the others (:mod:`serving_layer.snapshots`), and time travel over it
says what was published at any moment. Without any event, version 1 is published (a lake
from before versions); a new lake records its first publish, of each view's newest version,
when the archiver first starts on it (:func:`start_new_lake`).

Written with delta-rs from the command line (one small atomic append, no Spark session needed),
read with delta-rs or as rows handed in by the serving layer.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import pyarrow as pa

from lake.catalog import MASTER_EVENTS, VIEW_REGISTRY
from lake.errors import LakeError
from lake.settings import LakeSettings
from lake.storage import delta_options, is_delta, open_delta
from views.definitions import NEWEST, Definition, definition, versions

Event = Literal["building", "ready", "published", "retired"]
State = Literal["not built", "building", "ready", "published", "retired"]
EVENTS: Final = ("building", "ready", "published", "retired")


@dataclass(frozen=True)
class RegistryEvent:
    view: str
    version: int
    event: Event
    reason: str
    at: dt.datetime


class RegistryError(LakeError, ValueError):
    """A registry change that would leave readers on a version that cannot serve."""


@dataclass(frozen=True)
class Registry:
    """The registry's events in commit order, and what they mean."""

    events: tuple[RegistryEvent, ...] = ()

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, object]]) -> Registry:
        events = []
        for row in rows:
            at = row["at"]
            assert isinstance(at, dt.datetime)
            events.append(
                RegistryEvent(
                    str(row["view"]),
                    int(row["version"]),  # type: ignore[call-overload]
                    str(row["event"]),  # type: ignore[arg-type]
                    str(row["reason"]),
                    at.astimezone(dt.UTC),
                )
            )
        return cls(tuple(sorted(events, key=lambda e: e.at)))

    def published(self, view: str) -> Definition:
        """The published version of ``view`` (version 1 until another is published)."""
        for event in reversed(self.events):
            if event.view == view and event.event == "published":
                return definition(view, event.version)
        return definition(view, 1)

    def previous(self, view: str) -> Definition | None:
        """The version published before the current one (what a rollback restores)."""
        published = [e.version for e in self.events if e.view == view and e.event == "published"]
        current = published[-1] if published else 1
        for version in reversed([1, *published[:-1]]):
            if version != current:
                return definition(view, version)
        return None

    def state(self, view: str, version: int) -> State:
        if self.published(view).version == version:
            return "published"
        history = [
            e.event
            for e in self.events
            if (e.view, e.version) == (view, version) and e.event != "published"
        ]
        if history:
            return history[-1]
        was_published = any(
            e.view == view and e.version == version and e.event == "published" for e in self.events
        )
        return (
            "ready"
            if was_published or (version == 1 and not self._began_later(view))
            else ("not built")
        )

    def _began_later(self, view: str) -> bool:
        """Whether ``view``'s history began with a later version published (a new lake, see
        :func:`start_new_lake`): version 1 was then never built."""
        first = next((e for e in self.events if e.view == view), None)
        return first is not None and first.event == "published" and first.version != 1

    def live(self, view: str) -> tuple[Definition, ...]:
        """Versions readers may still need: published, ready or being built."""
        return tuple(
            d
            for d in versions(view)
            if self.state(view, d.version) in ("published", "ready", "building")
        )

    def history(self, view: str) -> Sequence[RegistryEvent]:
        return [e for e in self.events if e.view == view]

    def with_event(self, event: RegistryEvent) -> Registry:
        """This registry and ``event``, just recorded (:func:`record`), without reading it
        again."""
        return Registry((*self.events, event))


def read_registry(lake: LakeSettings, *, version: int | None = None) -> Registry:
    """The registry as it is (or at table ``version``), empty before its first event."""

    path = VIEW_REGISTRY.path(lake)
    if not is_delta(path, lake.object_store):
        return Registry()
    table = open_delta(path, lake.object_store, version=version)
    return Registry.from_rows(table.to_pyarrow_table().to_pylist())


def record(
    lake: LakeSettings,
    view: str,
    version: int,
    event: Event,
    reason: str,
    *,
    at: dt.datetime | None = None,
) -> RegistryEvent:
    """Append one event (one atomic commit) and return it."""
    from deltalake import write_deltalake

    definition(view, version)  # an unknown version is refused before anything is written
    entry = RegistryEvent(view, version, event, reason, at or dt.datetime.now(dt.UTC))
    row = {
        "view": entry.view,
        "version": entry.version,
        "event": entry.event,
        "reason": entry.reason,
        "at": entry.at,
    }
    data = pa.Table.from_pylist([row], schema=VIEW_REGISTRY.schema)
    path = VIEW_REGISTRY.path(lake)
    options = delta_options(path, lake.object_store)
    write_deltalake(path, data, mode="append", storage_options=options)
    return entry


def start_new_lake(lake: LakeSettings) -> list[RegistryEvent]:
    """On a new lake (no master/events and no registry event yet), publish each view's newest
    version, so its history starts with it; a lake with events keeps its published version
    until a build and publish move it. Returns the events recorded (none on an existing
    lake)."""

    if is_delta(MASTER_EVENTS.path(lake), lake.object_store) or read_registry(lake).events:
        return []
    return [
        record(lake, view, version, "published", "a new lake starts with the newest version")
        for view, version in NEWEST.items()
    ]
