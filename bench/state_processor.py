"""The speed layer's click attribution as Spark's own stateful operator would keep it:
``transformWithStateInPandas`` (or ``transformWithState``, rows) keyed by impression id, one
value per open impression in the state store, a timer per impression that drops it when the
watermark closes its bucket.

The rule is :mod:`speed_layer.attribution`'s, key by key (:func:`attribute_key`): only events
of open buckets count (the first open bucket follows from the batch's watermark, as in the speed
job); a key's impressions are taken before its clicks; the first impression of an id is the
one; a click within the attribution window after it is attributed (the impression's first) or a
repeat (its later ones) on the impression's bucket and dimensions, any other click an orphan on
its own. An impression whose bucket has closed is gone even before its timer has fired (Spark
runs a batch's timers after its data).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from speed_layer.attribution import BUCKET_MS
from views.columns import DIMENSIONS

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]

# What the operator takes per event (its grouping key, the impression id, comes with them).
INPUT_COLUMNS: Final = ("impression_id", "event_type", "event_ms", *DIMENSIONS)
IMPRESSION_STATE: Final = "bucket_ms long, event_ms long, clicked boolean, " + ", ".join(
    f"{d} string" for d in DIMENSIONS
)
OUTPUT_SCHEMA: Final = (
    "bucket_ms long, "
    + ", ".join(f"{d} string" for d in DIMENSIONS)
    + ", attributed_clicks long, orphan_clicks long, repeat_clicks long"
)
OUTPUT_COLUMNS: Final = (
    "bucket_ms",
    *DIMENSIONS,
    "attributed_clicks",
    "orphan_clicks",
    "repeat_clicks",
)


class Impression(NamedTuple):
    """The state of one impression id (the first impression of the id)."""

    bucket_ms: int
    event_ms: int
    clicked: bool
    dims: tuple[str, ...]


class Event(NamedTuple):
    kind: str  # impression | click
    event_ms: int
    dims: tuple[str, ...]


class Outcome(NamedTuple):
    """What one key's events did: the state to keep (None: unchanged), whether it is a new
    impression (a timer to register; ``replaced``: the expiry of the closed one it replaces),
    and the increments (:data:`OUTPUT_COLUMNS` rows)."""

    state: Impression | None
    new: bool
    replaced: int | None
    rows: list[tuple[Any, ...]]


def bucket_of(event_ms: int) -> int:
    return event_ms // BUCKET_MS * BUCKET_MS


def expiry_of(bucket_ms: int) -> int:
    """The timer that drops an impression of ``bucket_ms``: Spark fires a timer once the
    watermark is above it, and the bucket closes when the watermark reaches its end."""
    return bucket_ms + BUCKET_MS - 1


def open_from(watermark_ms: int) -> int:
    """The first open bucket under ``watermark_ms`` (speed_layer.tasks.closed_before's rule)."""
    return max(watermark_ms, 0) // BUCKET_MS * BUCKET_MS


def attribute_key(
    stored: Impression | None, events: Sequence[Event], open_from_ms: int, window_ms: int
) -> Outcome:
    """One key's events of a micro-batch against its state (see the module's docstring)."""
    current = stored if stored is not None and stored.bucket_ms >= open_from_ms else None
    replaced = expiry_of(stored.bucket_ms) if stored is not None and current is None else None
    on_time = [e for e in events if bucket_of(e.event_ms) >= open_from_ms]
    new = False
    for event in on_time:
        if event.kind == "impression" and current is None:
            current = Impression(bucket_of(event.event_ms), event.event_ms, False, event.dims)
            new = True
    changed = new
    counts: dict[tuple[int, tuple[str, ...]], list[int]] = {}
    for event in on_time:
        if event.kind != "click":
            continue
        if current is not None and 0 <= event.event_ms - current.event_ms <= window_ms:
            into = counts.setdefault((current.bucket_ms, current.dims), [0, 0, 0])
            if current.clicked:
                into[2] += 1
            else:
                into[0] += 1
                current = current._replace(clicked=True)
                changed = True
        else:
            counts.setdefault((bucket_of(event.event_ms), event.dims), [0, 0, 0])[1] += 1
    rows = [(bucket, *dims, *measures) for (bucket, dims), measures in counts.items()]
    return Outcome(current if changed else None, new, replaced if new else None, rows)


class _Attribution(StatefulProcessor):
    """The state's handling, shared by the pandas and the row processors."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.impression = handle.getValueState("impression", IMPRESSION_STATE)

    def _apply(self, events: Sequence[Event], timer_values: TimerValues) -> list[tuple[Any, ...]]:
        value = self.impression.get()
        stored = None
        if value is not None:
            bucket_ms, event_ms, clicked, *dims = value
            stored = Impression(int(bucket_ms), int(event_ms), bool(clicked), tuple(dims))
        watermark = timer_values.getCurrentWatermarkInMs()
        outcome = attribute_key(stored, events, open_from(watermark), self.window_ms)
        if outcome.state is not None:
            state = outcome.state
            self.impression.update((state.bucket_ms, state.event_ms, state.clicked, *state.dims))
        if outcome.replaced is not None:
            self.handle.deleteTimer(outcome.replaced)
        if outcome.new and outcome.state is not None:
            self.handle.registerTimer(expiry_of(outcome.state.bucket_ms))
        return outcome.rows

    def _expire(self) -> None:
        self.impression.clear()

    def close(self) -> None:
        pass


class PandasAttribution(_Attribution):
    """For ``transformWithStateInPandas``."""

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        events = [
            Event(kind, int(ms), tuple(dims))
            for frame in rows
            for kind, ms, *dims in frame[["event_type", "event_ms", *DIMENSIONS]].itertuples(
                index=False, name=None
            )
        ]
        out = self._apply(events, timerValues)
        if out:
            yield pd.DataFrame(out, columns=list(OUTPUT_COLUMNS))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        self._expire()
        return iter([])


class RowAttribution(_Attribution):
    """For ``transformWithState`` (rows: what Spark's guide suggests for many keys)."""

    def handleInputRows(
        self, key: Any, rows: Iterator[Row], timerValues: TimerValues
    ) -> Iterator[Row]:
        events = [
            Event(row["event_type"], int(row["event_ms"]), tuple(row[d] for d in DIMENSIONS))
            for row in rows
        ]
        for out in self._apply(events, timerValues):
            yield Row(**dict(zip(OUTPUT_COLUMNS, out, strict=True)))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        self._expire()
        return iter([])
