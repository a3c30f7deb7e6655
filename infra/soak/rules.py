"""`make soak`'s rules: what a series must keep over a long run, and the verdict on each.

Samples are rows ``(t, series, value)``: ``t`` seconds since the soak started, ``series`` a name
such as ``rss_mb.archiver`` or ``delta_log.master/events``. The rule a series keeps follows
from its family (the part before the first dot), :data:`RULES`:

- **bounded** (memory, files, log entries, checkpoint and Kafka bytes): its growth over the
  second half of the run may be at most ``max(floor, relative x median)`` per hour. The growth
  is the smaller of two slopes: the straight line fitted by least squares over the second half,
  and the rise of the peak from its third quarter to its last (a sawtooth that compaction or
  retention cuts back has a flat peak, whatever the phase the fit catches). The first half is
  warm-up (JVM heaps, the first compactions, retention windows filling); a series still
  climbing after it is a leak.
- **drift** (freshness, lag, latency): the same fit, with the floor in the series' own unit: a
  series drifting upward means the platform falls behind.
- **data** (bytes of the master dataset): grows with the data by design; reported with its
  growth per hour, not judged.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["bounded", "drift", "data"]


@dataclass(frozen=True)
class Rule:
    kind: Kind
    unit: str
    floor_per_hour: float  # growth per hour always allowed, in the series' unit
    relative_per_hour: float = 0.25  # growth per hour allowed relative to the median


RULES: Final[Mapping[str, Rule]] = {
    "rss_mb": Rule("bounded", "MB", 64.0),
    "cpu_pct": Rule("drift", "% of a core", 20.0),
    "table_files": Rule("bounded", "files", 30.0),
    "active_files": Rule("bounded", "files", 30.0),
    "table_mb": Rule("bounded", "MB", 16.0),
    "data_mb": Rule("data", "MB", 0.0),
    "delta_log": Rule("bounded", "files", 30.0),
    "delta_checkpoints": Rule("bounded", "files", 6.0),
    "checkpoint_files": Rule("bounded", "files", 60.0),
    "checkpoint_mb": Rule("bounded", "MB", 8.0),
    "kafka_mb": Rule("bounded", "MB", 64.0),
    "lag_records": Rule("drift", "records", 2_000.0, 0.0),
    "freshness_s": Rule("drift", "s", 5.0, 0.0),
    "api_p99_ms": Rule("drift", "ms", 100.0),
    # The last day's query reads all the data of a soak shorter than a day: it grows with it.
    "api_day_p99_ms": Rule("data", "ms", 0.0),
    "lake_rows": Rule("bounded", "rows", 500.0),
}


@dataclass(frozen=True)
class Verdict:
    series: str
    rule: Rule
    samples: int
    first: float
    last: float
    low: float
    high: float
    median_second_half: float
    slope_per_hour: float  # of the fit over the second half
    allowed_per_hour: float
    passed: bool

    @property
    def reason(self) -> str:
        if self.rule.kind == "data":
            return f"grows with the data: {self.slope_per_hour:+,.1f} {self.rule.unit}/h"
        verb = "within" if self.passed else "ABOVE"
        return (
            f"{self.slope_per_hour:+,.1f} {self.rule.unit}/h over the second half, {verb} "
            f"{self.allowed_per_hour:,.1f}"
        )


def family(series: str) -> str:
    return series.split(".", 1)[0]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(t, value)`` points, per unit of t; 0 for fewer than 2 times."""
    if len({t for t, _ in points}) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    num = sum((t - mean_t) * (v - mean_v) for t, v in points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    return num / den


def peak_slope(points: list[tuple[float, float]], duration_s: float) -> float:
    """Rise of the maximum from the third quarter of the run to the last, per unit of t
    (``points``: the second half); the fit's own slope when a quarter has no points."""
    cut = duration_s * 3 / 4
    third = [v for t, v in points if t < cut]
    last = [v for t, v in points if t >= cut]
    if not third or not last:
        return slope(points)
    return (max(last) - max(third)) / (duration_s / 4)


def judge(series: str, points: list[tuple[float, float]], duration_s: float) -> Verdict:
    """The verdict on one series' ``(t seconds, value)`` points of a ``duration_s`` run."""
    rule = RULES[family(series)]
    points = sorted(p for p in points if math.isfinite(p[1]))
    second = [p for p in points if p[0] >= duration_s / 2] or points
    median = statistics.median(v for _, v in second) if second else 0.0
    per_hour = min(slope(second), peak_slope(second, duration_s)) * 3600
    allowed = max(rule.floor_per_hour, rule.relative_per_hour * abs(median))
    passed = rule.kind == "data" or len(second) < 3 or per_hour <= allowed
    values = [v for _, v in points] or [0.0]
    return Verdict(
        series,
        rule,
        len(points),
        values[0],
        values[-1],
        min(values),
        max(values),
        median,
        per_hour,
        allowed,
        passed,
    )


def group(samples: Iterable[tuple[float, str, float]]) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, name, value in samples:
        series[name].append((t, value))
    return dict(series)


def verdicts(samples: Iterable[tuple[float, str, float]], duration_s: float) -> list[Verdict]:
    return [
        judge(name, points, duration_s)
        for name, points in sorted(group(samples).items())
        if family(name) in RULES
    ]
