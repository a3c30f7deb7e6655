"""The produce loop's summary: an event counts as late when it is over 10 minutes old when sent,
whether the generator made it late or the stream started in the past (``ctr produce --start``)."""

from __future__ import annotations

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
