"""CTR alerts: are they right (the truth over generated traffic), and what do they cost (1,000
rules evaluated each minute over a real lake)?

**Truth** (:mod:`alerts.truth`): 24 simulated hours (:mod:`alerts.simulate`: 4 big campaigns of
5 ads, 5 noise-only campaigns of 3 small ads, 7 baseline days) with a 30 % CTR drop on a big ad
and a click-tracking break on a campaign, evaluated minute by minute (1,440 windows) through
the evaluator's hysteresis (fire after 2, resolve after 5). Printed side by side for the
statistical rules (per campaign: its ads' CTR, its CTR, its clicks; alpha 0.01, minimum effect
20 %, 15-minute window, 7 days' baseline) and the naive threshold rule (window CTR outside
± 20 % of the long-run CTR, no test, no minimum sample): each injected change's detection and
delay, the misses, the false alarms on the noise campaigns and elsewhere.

**Cost**: a lake of 8 days (the evaluated day and its 7 baseline days) of minute rows of
:func:`bench.serving_lake.combos`' dimension combinations (300: 20 campaigns, their ads, 300
sites, 8 countries, 5 devices; :func:`bench.serving_lake.minute_rows`, without the reach
columns), batch/ctr with coverage but for the last 2 hours (speed/ctr). 1,000 rules over it
(per campaign: ads' CTR, CTR, clicks, impressions; per ad: CTR, clicks; per site: CTR, clicks;
per country: CTR per device, clicks; then the same with a 30-minute window), evaluated for the
last MINUTES windows of the day as the evaluator does (a fresh snapshot and
:class:`~alerts.lake_counts.LakeCounts` each minute, :func:`~alerts.evaluate.evaluate`, the
hysteresis). CPU seconds (``time.process_time``: DuckDB's threads included) and wall seconds
per minute, as a share of one core; where the time goes: the snapshot, DuckDB's counts (one
query per distinct window) and the Python evaluation. Not measured: the evaluator's commit of
its findings to alerts/events.

``BENCH_ALERTS_SCALE`` (default 1) shrinks everything for a smoke run: 0.02 is 2 simulated
hours, 20 rules, 20 combinations, 2 evaluated minutes; its result goes to
``bench/results/alerts-smoke.json``, not into the results table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from alerts.evaluate import Counts, Window, evaluate
from alerts.hysteresis import Hysteresis
from alerts.lake_counts import LakeCounts
from alerts.rules import Measure, Rule
from alerts.simulate import SimulatedTraffic, TrafficSpec
from alerts.truth import GRACE_MINUTES, Truth, rules_for, run
from bench.serving_lake import combos, minute_rows
from lake.settings import LakeSettings
from serving_layer.reader import SnapshotReader
from serving_layer.snapshots import SCHEMAS

RESULTS = Path("bench/results")
END = dt.datetime(2026, 11, 28, 0, 0, tzinfo=dt.UTC)
RULES = 1_000
MINUTES = 10  # evaluated windows in the cost part
LAKE_DAYS = 8
SPEED_HOURS = 2
GOAL_CORE_SHARE = 0.10
CAMPAIGN_MEASURES: tuple[Measure, ...] = ("ctr", "clicks", "impressions")
RATE_AND_COUNT: tuple[Measure, ...] = ("ctr", "clicks")


@dataclass(frozen=True)
class AlertsBenchSettings:
    """What the benchmark takes from its environment, read once at its start."""

    scale: float

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> AlertsBenchSettings:
        #: The alerts benchmark's size as a share of the full run (0 < x ≤ 1, default 1):
        #: 0.02 is a smoke run (2 simulated hours, 20 rules, 20 combinations, 2 minutes).
        scale = float(environ.get("BENCH_ALERTS_SCALE", "1"))
        if not 0 < scale <= 1:
            raise ValueError(f"BENCH_ALERTS_SCALE must be in (0, 1], got {scale}")
        return cls(scale)

    def scaled(self, full: int, least: int) -> int:
        return max(least, round(full * self.scale))


def main(events: int | None = None) -> dict[str, object]:
    """``events`` is ignored (the sizes are the module's, times BENCH_ALERTS_SCALE)."""
    settings = AlertsBenchSettings.from_environ(os.environ)
    hours = settings.scaled(24, 2)
    print(f"bench alerts: the truth over {hours} simulated hours ...", flush=True)
    truth_result = truth_part(hours)
    print("bench alerts: the cost of the rules over a lake ...", flush=True)
    cost = cost_part(
        rules=settings.scaled(RULES, 12),
        combinations=settings.scaled(300, 20),
        minutes=settings.scaled(MINUTES, 2),
    )
    result: dict[str, object] = {"scale": settings.scale, "truth": truth_result, "cost": cost}
    name = "alerts" if settings.scale == 1 else "alerts-smoke"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"bench alerts: result in {RESULTS / name}.json")
    return result


# -- the truth -----------------------------------------------------------------------------


def truth_part(hours: int) -> dict[str, Any]:
    spec = TrafficSpec(
        hours=hours, drop_minute=round(hours * 60 * 0.25), break_minute=round(hours * 60 * 0.6)
    )
    traffic = SimulatedTraffic(spec)
    rules = rules_for(traffic)
    started, cpu = time.perf_counter(), time.process_time()
    truth = run(traffic, rules)
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    evaluations = hours * 60
    print(
        f"\nbench alerts: {len(rules)} rules + {len(rules) * 2 // 3} threshold twins over "
        f"{evaluations:,} windows ({len(traffic.campaigns)} campaigns x "
        f"{spec.ads_per_campaign} ads, {len(traffic.noise)} noise campaigns x {spec.noise_ads} "
        f"ads), {wall_s:.1f} s"
    )
    print_changes(truth)
    print_tallies(truth)
    return {
        "hours": hours,
        "rules": len(rules),
        "seconds": wall_s,
        "cpu_seconds": cpu_s,
        "changes": [
            {
                "rule": o.expected.rule.name,
                "group": o.expected.group,
                "change": o.expected.change.kind,
                "effect": o.expected.effect,
                "start_minute": o.expected.change.minute,
                "reachable_minute": o.expected.reachable,
                "fired_minute": o.fired,
                "delay_minutes": o.delay,
                "required": o.required,
                "missed": o.missed,
            }
            for o in truth.outcomes
        ],
        "tallies": {name: t.__dict__ for name, t in truth.tallies.items()},
    }


def print_changes(truth: Truth) -> None:
    """Each injected change per (rule, group): the statistical rule and its threshold twin."""
    print(
        f"\n{'change':<16}{'rule':<16}{'group':<14}{'effect':>8}{'start':>7}{'can':>6}"
        f"{'  rule: delay':>14}{'  threshold: delay':>19}"
    )
    twins = {(o.expected.rule.name, o.expected.group): o for o in truth.outcomes}
    for o in truth.outcomes:
        rule = o.expected.rule.name
        if rule.startswith("threshold-"):
            continue
        twin = twins.get((f"threshold-{rule}", o.expected.group))
        print(
            f"{o.expected.change.kind:<16}{rule:<16}{o.expected.group or '-':<14}"
            f"{o.expected.effect:>8.0%}{o.expected.change.minute:>7}{o.expected.reachable:>6}"
            f"{_said(o):>14}{_said(twin) if twin else 'n/a':>19}"
        )
    print(
        "(start: the change's first minute; can: the first window end whose expected change "
        "reaches the rule's minimum effect; delay: minutes from the start to the window that "
        f"fired; MISSED: required and not fired by can + {GRACE_MINUTES})"
    )


def _said(outcome: Any) -> str:
    if outcome.delay is None:
        return "MISSED" if outcome.missed else "not fired"
    return f"{outcome.delay} min" + (" MISSED" if outcome.missed else "")


def print_tallies(truth: Truth) -> None:
    print(
        f"\n{'rules':<24}{'tested':>9}{'detections':>12}{'delays (min)':>16}{'misses':>8}"
        f"{'false alarms: noise':>21}{'other':>7}"
    )
    for tally in truth.tallies.values():
        delays = ", ".join(str(d) for d in sorted(set(tally.delays))) or "-"
        tested = f"{tally.tested / max(1, tally.evaluations):.0%}"
        print(
            f"{tally.family:<24}{tested:>9}{tally.detections:>12}{delays:>16}{tally.misses:>8}"
            f"{tally.false_alarms_noise:>21}{tally.false_alarms_other:>7}"
        )


# -- the cost ------------------------------------------------------------------------------


def cost_part(*, rules: int, combinations: int, minutes: int) -> dict[str, Any]:
    dims = combos(combinations)
    chosen = cost_rules(dims, rules)
    with tempfile.TemporaryDirectory(prefix="ctr-bench-alerts-") as scratch:
        lake = LakeSettings(lake_root=Path(scratch) / "lake", checkpoint_root=Path(scratch) / "ck")
        started = time.perf_counter()
        rows = write_lake(lake, dims)
        print(
            f"bench alerts: lake of {rows:,} minute rows ({LAKE_DAYS} days x {combinations} "
            f"combinations) written in {time.perf_counter() - started:.0f} s; {len(chosen)} "
            f"rules, {minutes} minutes evaluated",
            flush=True,
        )
        reader = SnapshotReader(lake, refresh_s=0)
        states: States = {}
        try:
            ends = [END - dt.timedelta(minutes=m) for m in range(minutes, 0, -1)]
            ticks = [tick(reader, chosen, end, states) for end in ends]
        finally:
            reader.close()
    return summarize_cost(ticks, rows=rows, rules=len(chosen), combinations=combinations)


def cost_rules(dims: Mapping[str, np.ndarray], n: int) -> list[Rule]:
    """The first ``n`` of the families the module's docstring lists."""

    def values(name: str) -> list[str]:
        return sorted({str(v) for v in dims[name]})

    def candidates() -> Iterator[Rule]:
        for window in (15, 30, 60):
            tail = "" if window == 15 else f"-w{window}"
            for campaign in values("campaign_id"):
                where = ("campaign_id", campaign)
                yield Rule(f"{campaign}-ads{tail}", "ctr", where, "ad_id", window)
                for measure in CAMPAIGN_MEASURES:
                    yield Rule(f"{campaign}-{measure}{tail}", measure, where, None, window)
            for dimension in ("ad_id", "site_id"):
                for value in values(dimension):
                    for measure in RATE_AND_COUNT:
                        yield Rule(f"{value}-{measure}{tail}", measure, (dimension, value), None,
                                   window)  # fmt: skip
            for country in values("country"):
                where = ("country", country)
                yield Rule(f"{country}-devices{tail}", "ctr", where, "device_type", window)
                yield Rule(f"{country}-clicks{tail}", "clicks", where, None, window)

    found = list(islice(candidates(), n))
    for rule in found:
        rule.check()
    return found


def write_lake(lake: LakeSettings, dims: dict[str, np.ndarray]) -> int:
    """LAKE_DAYS days to END of minute rows: batch/ctr (one commit and coverage a day) but for
    the last SPEED_HOURS, speed/ctr."""
    start = END - dt.timedelta(days=LAKE_DAYS)
    speed_start = END - dt.timedelta(hours=SPEED_HOURS)
    rows = 0
    at, day = start, 0
    while at < speed_start:
        until = min(at + dt.timedelta(days=1), speed_start)
        minutes = int((until - at) / dt.timedelta(minutes=1))
        run_id = f"run-{day}"
        table = minute_rows(at, minutes, dims, seed=day)
        table = table.append_column("run_id", pa.array([run_id] * len(table)))
        write_deltalake(lake.table("batch/ctr"), _conform(table, "batch/ctr"), mode="append")
        coverage = pa.Table.from_pylist(
            [{"run_id": run_id, "view": "ctr", "interval_start": at, "interval_end": until,
              "input_version": day, "rows_written": len(table), "finished_at": until}],
            schema=SCHEMAS["batch/coverage"],
        )  # fmt: skip
        write_deltalake(lake.table("batch/coverage"), coverage, mode="append")
        rows += len(table)
        at, day = until, day + 1
    table = minute_rows(speed_start, SPEED_HOURS * 60, dims, seed=1000)
    table = table.append_column(
        "updated_at", pa.array([END] * len(table), pa.timestamp("us", tz="UTC"))
    )
    write_deltalake(lake.table("speed/ctr"), _conform(table, "speed/ctr"), mode="append")
    return rows + len(table)


def _conform(table: pa.Table, name: str) -> pa.Table:
    """``table`` with ``name``'s schema: the columns it lacks (reach, attribution) null."""
    schema = SCHEMAS[name]
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


class TimedCounts:
    """A CountSource that times the one it wraps (CPU and wall seconds, queries)."""

    def __init__(self, source: LakeCounts) -> None:
        self.source = source
        self.cpu_s = self.wall_s = 0.0
        self.queries = 0
        self.rows = 0

    def counts(self, window: Window, dimensions: Sequence[str]) -> Mapping[tuple[str, ...], Counts]:
        started, cpu = time.perf_counter(), time.process_time()
        found = self.source.counts(window, dimensions)
        self.wall_s += time.perf_counter() - started
        self.cpu_s += time.process_time() - cpu
        self.queries += 1
        self.rows += len(found)
        return found

    def speed_behind(self, end: dt.datetime, max_lag: dt.timedelta) -> str | None:
        return self.source.speed_behind(end, max_lag)


States = dict[tuple[str, str | None], Hysteresis]


def tick(
    reader: SnapshotReader, rules: Sequence[Rule], end: dt.datetime, states: States
) -> dict[str, float]:
    """One minute's evaluation as the evaluator makes it, timed in parts."""
    started, cpu = time.perf_counter(), time.process_time()
    source = TimedCounts(LakeCounts(reader))
    snapshot_wall, snapshot_cpu = time.perf_counter() - started, time.process_time() - cpu
    findings = evaluate(rules, source, end)
    for finding in findings:
        key = (finding.rule.name, finding.group)
        states.setdefault(key, Hysteresis()).update(finding.result.tested, finding.significant)
    wall, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    return {
        "wall_s": wall,
        "cpu_s": cpu_s,
        "snapshot_wall_s": snapshot_wall,
        "snapshot_cpu_s": snapshot_cpu,
        "duckdb_wall_s": source.wall_s,
        "duckdb_cpu_s": source.cpu_s,
        "python_wall_s": wall - snapshot_wall - source.wall_s,
        "python_cpu_s": cpu_s - snapshot_cpu - source.cpu_s,
        "queries": source.queries,
        "rows": source.rows,
        "tests": len(findings),
    }


def summarize_cost(
    ticks: list[dict[str, float]], *, rows: int, rules: int, combinations: int
) -> dict[str, Any]:
    """The first minute (cold: the lake's relations built) apart, the median of the others."""
    warm = ticks[1:] or ticks
    median = {k: statistics.median(t[k] for t in warm) for k in ticks[0]}
    share = median["cpu_s"] / 60.0
    print(f"\nbench alerts: {rules:,} rules over {rows:,} lake rows, per minute "
          f"(median of {len(warm)} warm minutes; the first, cold: {ticks[0]['wall_s']:.2f} s wall,"
          f" {ticks[0]['cpu_s']:.2f} s CPU)")  # fmt: skip
    print(f"{'part':<40}{'CPU s':>10}{'wall s':>10}")
    for part, label in (
        ("snapshot", "a fresh snapshot and its merged view"),
        ("duckdb", f"DuckDB counts ({median['queries']:.0f} windows, {median['rows']:,.0f} rows)"),
        ("python", f"Python: evaluate ({median['tests']:,.0f} tests) + hysteresis"),
    ):
        print(f"{label:<40}{median[f'{part}_cpu_s']:>10.3f}{median[f'{part}_wall_s']:>10.3f}")
    print(f"{'total':<40}{median['cpu_s']:>10.3f}{median['wall_s']:>10.3f}")
    print(f"share of one core per minute: {share:.2%} (goal ≤ {GOAL_CORE_SHARE:.0%})")
    return {
        "rules": rules,
        "lake_rows": rows,
        "combinations": combinations,
        "lake_days": LAKE_DAYS,
        "minutes": len(ticks),
        "cold": ticks[0],
        "median": median,
        "core_share": share,
        "goal": f"<= {GOAL_CORE_SHARE:.0%} of one core",
        "met": share <= GOAL_CORE_SHARE,
    }


if __name__ == "__main__":
    main()
