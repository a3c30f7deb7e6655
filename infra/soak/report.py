"""`make soak`'s report: ``report.md`` (exactness, kills and recovery, a table of every series
with its verdict), the samples, requests and kills as CSV, and a PNG plot per group of series."""

from __future__ import annotations

import csv
import datetime as dt
import shutil
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from infra.soak.chaos import Chaos, Kill
from infra.soak.config import Config
from infra.soak.console import log
from infra.soak.exactness import Exactness
from infra.soak.rules import RULES, Verdict, family, group, verdicts
from infra.soak.sampler import Sampler

# Shorter runs report their series without judging them: a second half shorter than the
# retention windows plus a maintenance period (15 + 15 min, scaled) shows warm-up, not a trend.
JUDGED_FROM_MINUTES: Final = 40


def write_csvs(out: Path, sampler: Sampler, kills: list[Kill]) -> None:
    """``samples.csv``, ``requests.csv`` and ``kills.csv`` under ``out``."""
    with (out / "samples.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t", "series", "value"])
        writer.writerows(sampler.rows)
    with (out / "requests.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t", "status", "ms"])
        writer.writerows(sampler.requests)
    with (out / "kills.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t", "target", "detail", "back_s", "lags_normal_s"])
        writer.writerows((k.t, k.target, k.detail, k.back_s, k.normal_s) for k in kills)


def read_samples(path: Path) -> list[tuple[float, str, float]]:
    with path.open(newline="") as handle:
        return [(float(r["t"]), r["series"], float(r["value"])) for r in csv.DictReader(handle)]


def write_report(
    config: Config, sampler: Sampler, chaos: Chaos | None, exact: Exactness, duration: float
) -> int:
    """Every file of the report under ``config.out``; the exit status (0: the soak passed)."""
    out = config.out
    kills = chaos.kills if chaos is not None else []
    write_csvs(out, sampler, kills)
    found = verdicts(sampler.rows, duration)
    plots = plot(sampler.rows, out, events=[(k.t, k.target) for k in kills])
    api_kills = [k for k in kills if k.target == "api"]
    errors = [r for r in sampler.requests if r[1] >= 500 or r[1] == 0]
    excused = [
        r for r in errors if any(k.t <= r[0] <= k.t + (k.back_s or 900) + 5 for k in api_kills)
    ]
    unexcused = len(errors) - len(excused)
    judged = duration >= JUDGED_FROM_MINUTES * 60
    failures = [v for v in found if not v.passed] if judged else []
    recovered = [k for k in kills if k.normal_s is not None]
    slow = [k for k in kills if k.back_s is None or k.normal_s is None or k.normal_s > 60]
    ok = not failures and exact.passed and unexcused == 0 and (not config.chaos or not slow)
    lines = [
        f"# Soak report: {'PASS' if ok else 'FAIL'}",
        "",
        f"{config.minutes:g} min at {config.rate:,} events/s"
        + (f", chaos: {len(kills)} kills" if config.chaos else "")
        + f"; {len(sampler.rows):,} samples of {len({r[1] for r in sampler.rows})} series; "
        f"finished {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Rules: infra/soak/rules.py.",
        "",
        "## Exactness after draining",
        "",
        f"- producer delivered {exact.truth_events:,} valid events; `master/events` holds "
        f"{exact.archived_rows:,} rows of {exact.archived_records:,} Kafka records (the "
        f"producer's resent duplicates among them), {exact.archived_distinct:,} distinct ids: "
        f"**{exact.lost:,} lost, {exact.duplicated:,} archived twice**",
        f"- exact view vs ground truth: {exact.batch_rows_wrong:,} of "
        f"{exact.batch_rows_compared:,} rows differ (impressions {exact.batch_impressions:,} vs "
        f"{exact.truth_impressions:,}, raw clicks {exact.batch_raw_clicks:,} vs "
        f"{exact.truth_clicks:,})",
        f"- speed view, impressions over the {exact.speed_minutes} minutes of the soak the batch "
        f"layer had not covered yet (the rest were pruned from speed/ctr): "
        f"{exact.speed_error:+.2%} from the truth (approximate by design)",
        f"- API: {len(sampler.requests):,} requests of the two fixed queries, {len(errors)} failed "
        f"(5xx or no answer), {len(excused)} of them while the API itself restarted",
    ]
    lines += [f"  - {e}" for e in exact.examples]
    lines += [
        "",
        "Retention windows scaled to the soak (each turns over in its first half): "
        + ", ".join(f"`{k}={v}`" for k, v in config.scaled_windows().items()),
    ]
    if config.chaos:
        normal = [k.normal_s for k in recovered if k.normal_s is not None]
        lines += [
            "",
            "## Kills and recovery",
            "",
            f"{len(kills)} kills, {len(recovered)} recovered; lags back to normal: "
            + (
                f"median {statistics.median(normal):.0f} s, max {max(normal):.0f} s"
                if normal
                else "none"
            ),
            "",
            "| at (min) | component | what | running again (s) | lags normal (s) |",
            "|---:|---|---|---:|---:|",
        ]
        lines += [
            f"| {k.t / 60:.1f} | {k.target} | {k.detail} | {k.back_s} | {k.normal_s} |"
            for k in kills
        ]
    lines += ["", "## Series", ""]
    if not judged:
        lines += [
            f"(A {config.minutes:g}-minute run: the series are shown, not judged; runs of "
            f"{JUDGED_FROM_MINUTES} minutes or more are.)",
            "",
        ]
    lines += [table_markdown(found, judged=judged), ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    log(f"report: {out / 'report.md'} ({'PASS' if ok else 'FAIL'})")
    for v in failures:
        log(f"FAIL {v.series}: {v.reason}")
    if not exact.passed:
        log(
            f"FAIL exactness: {exact.lost} lost, {exact.duplicated} duplicated, "
            f"{exact.batch_rows_wrong} view rows wrong"
        )
    if unexcused:
        log(f"FAIL api: {unexcused} failed requests outside the API's restarts")
    if config.chaos and slow:
        log(f"FAIL recovery: {len(slow)} kill(s) not back to normal within 60 s")
    return 0 if ok else 1


def publish(out: Path, docs: Path, *, chaos: bool) -> Path:
    """The report under ``out`` as a page of the docs site: ``docs/report.md`` (`make soak`)
    or ``docs/chaos.md`` (``CHAOS=1``), its plots beside it (``chaos-*.png`` for a chaos run,
    so the two pages keep their own); returns the page."""
    prefix = "chaos-" if chaos else ""
    docs.mkdir(parents=True, exist_ok=True)
    text = (out / "report.md").read_text()
    for png in sorted(out.glob("*.png")):
        shutil.copyfile(png, docs / f"{prefix}{png.name}")
        text = text.replace(f"]({png.name})", f"]({prefix}{png.name})")
    command = "make soak CHAOS=1" if chaos else "make soak"
    title, _, rest = text.partition("\n")
    page = docs / ("chaos.md" if chaos else "report.md")
    page.write_text(f"{title}\n\nWritten by `{command}` on the machine it ran on.\n{rest}")
    return page


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
