"""`make soak`'s verdicts and report: the rules a series must keep over a long run, a table of
every series, and a PNG plot per group of series.

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

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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


def read_samples(path: Path) -> list[tuple[float, str, float]]:
    with path.open(newline="") as handle:
        return [(float(r["t"]), r["series"], float(r["value"])) for r in csv.DictReader(handle)]


def verdicts(samples: Iterable[tuple[float, str, float]], duration_s: float) -> list[Verdict]:
    return [
        judge(name, points, duration_s)
        for name, points in sorted(group(samples).items())
        if family(name) in RULES
    ]


def table_markdown(found: list[Verdict], *, judged: bool = True) -> str:
    lines = [
        "| series | unit | first | last | max | median (2nd half) | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for v in found:
        mark = "data" if v.rule.kind == "data" else ("ok" if v.passed else "**FAIL**")
        if not judged and mark != "data":
            mark = "not judged"
        lines.append(
            f"| `{v.series}` | {v.rule.unit} | {_num(v.first)} | {_num(v.last)} | "
            f"{_num(v.high)} | {_num(v.median_second_half)} | {mark}: {v.reason} |"
        )
    return "\n".join(lines)


def _num(value: float) -> str:
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


PLOTS: Final[Mapping[str, tuple[str, ...]]] = {
    "memory-cpu": ("rss_mb", "cpu_pct"),
    "delta-tables": ("table_files", "active_files", "delta_log", "delta_checkpoints"),
    "storage": ("table_mb", "data_mb", "checkpoint_mb", "checkpoint_files", "kafka_mb"),
    "pipeline": ("lag_records", "freshness_s", "api_p99_ms", "api_day_p99_ms"),
}


def plot(
    samples: Sequence[tuple[float, str, float]],
    out_dir: Path,
    *,
    events: Iterable[tuple[float, str]] = (),
) -> list[Path]:
    """One PNG per entry of :data:`PLOTS` (a panel per family, a line per series), chaos kills
    drawn as vertical lines; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = group(samples)
    marks = list(events)
    written = []
    for title, families in PLOTS.items():
        present = [f for f in families if any(family(n) == f for n in by_name)]
        if not present:
            continue
        fig, axes = plt.subplots(len(present), 1, figsize=(11, 3.2 * len(present)), squeeze=False)
        for ax, fam in zip(axes[:, 0], present, strict=True):
            for name in sorted(n for n in by_name if family(n) == fam):
                pts = sorted(by_name[name])
                ax.plot([t / 60 for t, _ in pts], [v for _, v in pts], label=name.split(".", 1)[-1])
            for t, _label in marks:
                ax.axvline(t / 60, color="red", alpha=0.25, linewidth=1)
            ax.set_title(f"{fam} ({RULES[fam].unit})", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left", ncol=3)
        axes[-1, 0].set_xlabel("minutes into the soak" + (" (red: kills)" if marks else ""))
        fig.tight_layout()
        path = out_dir / f"{title}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written
