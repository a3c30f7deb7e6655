"""make soak's rules (infra/soak/rules.py): what counts as growing without bound, as drift, as
data; the report table and the plots. Pure logic on made-up series."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from infra.soak.processes import Proc, own_memory
from infra.soak.report import plot, publish, table_markdown
from infra.soak.rules import judge, slope, verdicts
from infra.soak.sampler import RecentP99, window_query

HOUR = 3600.0


def series(values: list[float], every_s: float = 60.0) -> list[tuple[float, float]]:
    return [(i * every_s, v) for i, v in enumerate(values)]


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert slope([(0, 4)]) == 0.0
    assert slope([(0, 1), (10, 1), (20, 1)]) == 0.0


def test_a_process_spawned_before_its_exec_is_not_counted_twice() -> None:
    mb = 2**20
    procs = {
        1: Proc(1, 0, 1, 0, 3 * mb, vsize=10 * mb),  # the supervising shell
        2: Proc(2, 1, 1, 0, 300 * mb, vsize=900 * mb),  # python driver
        3: Proc(3, 2, 1, 0, 1000 * mb, vsize=5000 * mb),  # its JVM
        4: Proc(4, 3, 1, 0, 1000 * mb, vsize=5000 * mb),  # the JVM spawning a command
        5: Proc(5, 3, 1, 0, 2 * mb, vsize=8 * mb),  # a command after its exec
    }
    assert own_memory([1, 2, 3, 4, 5], procs) == 1305 * mb
    assert own_memory([1, 2, 3, 5, 99], procs) == 1305 * mb  # gone between reads: skipped


def test_memory_that_levels_off_after_warm_up_passes() -> None:
    # 60 min: rises 400 MB in the first 20 min, then flat with noise.
    values = [min(i, 20) * 20.0 + 500 + (5 if i % 2 else -5) for i in range(61)]
    verdict = judge("rss_mb.speed", series(values), HOUR)
    assert verdict.passed, verdict.reason
    assert verdict.high == pytest.approx(905)


def test_memory_still_climbing_in_the_second_half_fails() -> None:
    values = [500 + 4.0 * i for i in range(61)]  # 240 MB/h on ~600 MB: a leak
    verdict = judge("rss_mb.api", series(values), HOUR)
    assert not verdict.passed
    assert verdict.slope_per_hour == pytest.approx(240.0)
    assert "ABOVE" in verdict.reason


def test_a_sawtooth_of_files_compacted_every_ten_minutes_passes() -> None:
    values = [float(i % 10) * 30 + 5 for i in range(61)]
    assert judge("active_files.master/events", series(values), HOUR).passed


def test_files_piling_up_fail() -> None:
    values = [float(6 * i) for i in range(61)]  # 360 files/h, never compacted
    assert not judge("active_files.master/events", series(values), HOUR).passed


def test_lag_drifting_upward_fails_whatever_its_size() -> None:
    values = [1000.0 + 100 * i for i in range(61)]  # +6,000 records/h: falling behind
    assert not judge("lag_records.speed", series(values), HOUR).passed
    steady = [1000.0 + (300 if i % 3 == 0 else 0) for i in range(61)]
    assert judge("lag_records.speed", series(steady), HOUR).passed


def test_data_grows_by_design_and_is_reported_not_judged() -> None:
    verdict = judge("data_mb.master/events", series([10.0 * i for i in range(61)]), HOUR)
    assert verdict.passed
    assert "grows with the data" in verdict.reason
    assert verdict.slope_per_hour == pytest.approx(600.0)


def test_the_judged_query_reads_a_window_of_constant_size_and_the_days_query_is_reported() -> None:
    """The last day's query reads all the data a soak has made, so its latency grows with it;
    the judged one asks for the same 15 whole minutes for a whole minute (one cache key)."""
    at = dt.datetime(2026, 11, 26, 19, 42, 31, tzinfo=dt.UTC)
    query = window_query(at)
    assert query == window_query(at.replace(second=59))
    assert "start=2026-11-26T19:27:00Z" in query
    assert "granularity=minute" in query
    climbing = series([100.0 + 10 * i for i in range(61)])
    assert not judge("api_p99_ms.fixed_query", climbing, HOUR).passed
    assert "grows with the data" in judge("api_day_p99_ms.dashboard", climbing, HOUR).reason


def test_a_samples_p99_is_over_the_probes_of_the_last_five_samples() -> None:
    """40 probes a minute, one of them a cache miss: one minute's p99 would be that miss; over
    five minutes (200 probes) it is the second slowest, and a minute leaves after five more."""
    assert RecentP99(samples=5).add([]) is None
    recent = RecentP99(samples=5)
    minute = [2.0] * 39
    assert recent.add([*minute, 400.0]) == 400.0
    assert recent.add([*minute, 150.0]) == 400.0  # 80 probes: their maximum
    assert recent.add([*minute, 200.0]) == 200.0  # 120: the second slowest
    recent.add([*minute, 100.0])
    assert recent.add([*minute, 300.0]) == 300.0  # 200 probes
    assert recent.add([*minute, 120.0]) == 200.0  # the 400 ms minute has left the window
    assert recent.add([]) == 200.0  # a sample without answers adds none


def test_too_few_samples_in_the_second_half_are_not_judged() -> None:
    assert judge("rss_mb.api", [(0, 1.0), (3000, 900.0)], HOUR).passed


def test_verdicts_skip_unknown_families_and_the_table_marks_failures() -> None:
    rows = [(t, "rss_mb.api", 500 + 4.0 * t / 60) for t in range(0, 3601, 60)]
    rows += [(t, "something.else", 1.0) for t in range(0, 3601, 60)]
    found = verdicts(rows, HOUR)
    assert [v.series for v in found] == ["rss_mb.api"]
    table = table_markdown(found)
    assert "`rss_mb.api`" in table
    assert "**FAIL**" in table


def test_plots_are_pngs_one_per_group(tmp_path: Path) -> None:
    rows = [(t, "rss_mb.api", 500.0) for t in range(0, 600, 60)]
    rows += [(t, "lag_records.speed", 10.0) for t in range(0, 600, 60)]
    written = plot(rows, tmp_path, events=[(120.0, "api")])
    assert sorted(p.name for p in written) == ["memory-cpu.png", "pipeline.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("chaos", "name", "image"),
    [(False, "report.md", "pipeline.png"), (True, "chaos.md", "chaos-pipeline.png")],
)
def test_the_report_is_published_as_its_docs_page_with_its_plots(
    tmp_path: Path, chaos: bool, name: str, image: str
) -> None:
    out, docs = tmp_path / "soak", tmp_path / "docs" / "soak"
    out.mkdir()
    (out / "report.md").write_text("# Soak report: PASS\n\nbody\n\n![pipeline](pipeline.png)\n")
    (out / "pipeline.png").write_bytes(b"png")
    written = publish(out, docs, chaos=chaos)
    assert written == docs / name
    text = written.read_text()
    assert text.startswith("# Soak report: PASS\n\nWritten by `make soak")
    assert f"![pipeline]({image})" in text
    assert (docs / image).read_bytes() == b"png"
