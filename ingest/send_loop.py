"""The produce loop: a record stream into the producer, paced or flat out, until told to stop."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from ingest.ground_truth import GroundTruth
from ingest.producer import EventProducer
from ingest.traffic import Record
from runtime.shutdown import StopRequest

ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class ProduceSummary:
    records: int
    events: int
    duplicates: int
    malformed: int
    late: int
    seconds: float
    stopped_by: str | None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Pacing:
    """How fast and for how long the loop sends, by which clock."""

    rate: float | None = None  # records/s; None: as fast as the producer accepts them
    duration_s: float | None = None  # None: no time limit
    # With a rate: seconds of the stream that are due at once (a stream whose clock starts in
    # the past: its backlog up to now as fast as the producer accepts it, then at the rate).
    catch_up_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time  # seconds since the epoch: what "late" is to


# An event older than this when sent is late (the speed layer's default watermark): the
# generator's late events, and every event of a stream started in the past (--start).
LATE_AFTER_MS: Final = 10 * 60 * 1000


def produce(
    records: Iterable[Record],
    producer: EventProducer,
    *,
    limit: int | None = None,
    pacing: Pacing | None = None,
    stop: StopRequest | None = None,
    ground_truth: GroundTruth | None = None,
    on_progress: ProgressCallback | None = None,
) -> ProduceSummary:
    """Send records until ``limit`` records, ``pacing.duration_s`` seconds or a stop request.

    With ``pacing.rate`` (records/s) the loop waits for the clock, serving delivery reports
    while it waits (after the first ``pacing.catch_up_s`` seconds of records, sent at once);
    without it, it sends as fast as the producer accepts. ``ground_truth``
    counts the original events the producer accepted for the event topic.
    """
    pacing = pacing or Pacing()
    rate, clock = pacing.rate, pacing.clock
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    start = clock()
    deadline = start + pacing.duration_s if pacing.duration_s is not None else None
    counts = {"event": 0, "duplicate": 0, "malformed": 0}
    late = sent = 0
    stopped_by = None
    iterator = iter(records)
    while limit is None or sent < limit:
        if sent % 256 == 0:
            done, stopped_by = _time_to_stop(stop, deadline, clock)
            if done:
                break
            if on_progress is not None:
                on_progress(sent)
        if rate is not None:
            _wait_until(start + sent / rate - pacing.catch_up_s, producer, clock)
        try:
            record = next(iterator)
        except StopIteration:
            break
        accepted = producer.send(record.value, record.key)
        counts[record.kind] += 1
        if record.kind == "event":
            old = (
                record.event is not None
                and record.event.event_time < pacing.wall_clock() * 1000 - LATE_AFTER_MS
            )
            late += record.late or old
            if accepted and ground_truth is not None and record.event is not None:
                ground_truth.add(record.event)
        sent += 1
    if on_progress is not None:
        on_progress(sent)
    return ProduceSummary(
        records=sent,
        events=counts["event"],
        duplicates=counts["duplicate"],
        malformed=counts["malformed"],
        late=late,
        seconds=clock() - start,
        stopped_by=stopped_by,
    )


def _time_to_stop(
    stop: StopRequest | None, deadline: float | None, clock: Callable[[], float]
) -> tuple[bool, str | None]:
    """(whether to stop now, the signal that asked for it)."""
    if stop is not None and stop.requested:
        return True, stop.signal_name
    return deadline is not None and clock() >= deadline, None


def _wait_until(due: float, producer: EventProducer, clock: Callable[[], float]) -> None:
    """Serve delivery reports until the clock reaches ``due``."""
    ahead = due - clock()
    if ahead > 0.001:
        producer.poll(ahead)
