"""The produce loop's summary: an event counts as late when it is over 10 minutes old when sent,
whether the generator made it late or the stream started in the past (``ctr produce --start``)."""

from __future__ import annotations

import pytest

from ingest.send_loop import Pacing, produce
from ingest.traffic import TrafficConfig, TrafficGenerator

NOW_S = 1_795_800_000.0  # 2026-11-27, the wall clock of these tests


class Accepting:
    """A producer that accepts every record (the loop's only use of it without pacing)."""

    def send(self, value: bytes, key: bytes | None) -> bool:
        return True


def _summary(start_ms: int, late_fraction: float = 0.0) -> tuple[int, int]:
    config = TrafficConfig(seed=7, start_ms=start_ms, late_fraction=late_fraction)
    summary = produce(
        TrafficGenerator(config),
        Accepting(),  # type: ignore[arg-type]
        limit=500,
        pacing=Pacing(wall_clock=lambda: NOW_S),
    )
    return summary.events, summary.late


def test_a_stream_started_an_hour_ago_is_late_and_a_live_one_is_not() -> None:
    events, late = _summary(int(NOW_S * 1000) - 3_600_000)
    assert late == events > 0
    assert _summary(int(NOW_S * 1000))[1] == 0


def test_the_generators_late_events_count_in_a_live_stream() -> None:
    events, late = _summary(int(NOW_S * 1000), late_fraction=0.2)
    assert 0 < late < events


class Clocked(Accepting):
    """A producer whose waits advance a fake clock: what the loop waited for, in seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sent_at: list[float] = []

    def send(self, value: bytes, key: bytes | None) -> bool:
        self.sent_at.append(self.now)
        return True

    def poll(self, timeout: float) -> int:
        self.now += timeout
        return 0


def test_a_paced_stream_sends_its_backlog_at_once_then_keeps_the_rate() -> None:
    """``ctr produce --rate 10 --start <30 s ago>``: 300 records due at once, then 10 a
    second (the demo's history and live traffic, one stream)."""
    producer = Clocked()
    produce(
        TrafficGenerator(TrafficConfig(seed=7, start_ms=int(NOW_S * 1000) - 30_000)),
        producer,  # type: ignore[arg-type]
        limit=320,
        pacing=Pacing(rate=10, catch_up_s=30, clock=lambda: producer.now),
    )
    assert producer.sent_at[:301] == [0.0] * 301
    assert producer.sent_at[310] == pytest.approx(1.0)
    assert producer.sent_at[319] == pytest.approx(1.9)
