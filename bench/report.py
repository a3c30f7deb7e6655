"""The benchmarks' results in one table: ``bench/results/RESULTS.md`` and ``results.json``, and
the same Markdown table on the docs site's performance page (docs/performance.md).

Each benchmark writes ``bench/results/<name>.json``; the report is built from whichever of those
files exist, so running one benchmark refreshes its row and keeps the others. A benchmark that
failed leaves ``<name>.error.json`` instead, and its row says so.

``python -m bench.report`` (``make bench-table``) rebuilds the table without running anything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.report_rows import Row, _beside_batch, _num, _replicas, _state

RESULTS = Path("bench/results")
PAGE = Path("docs/performance.md")
ORDER = (
    "ingest",
    "archive",
    "batch",
    "scale",
    "passes",
    "speed",
    "serving",
    "beside-batch",
    "replicas",
    "reach",
    "storage",
    "alerts",
    "state",
    "sql-wire",
)
TABLE_START = "<!-- bench-table:start -->"
TABLE_END = "<!-- bench-table:end -->"


def _ingest(r: Mapping[str, Any]) -> Row:
    three = r.get("three_brokers") or {}
    extra = ""
    if three:
        extra = (
            f"; 3 brokers, acks=all: {_num(three['project_events_per_s'])} events/s "
            f"(kcat {_num(three['kcat_events_per_s'])}, ratio {three['ratio']:.2f})"
        )
    if r.get("failover_s"):
        extra += f"; leader SIGKILL to sends again: {max(r['failover_s']):.1f} s at most"
    return Row(
        "ingest",
        f"{_num(r['project_events_per_s'])} events/s "
        f"(project producer, {_num(r['events'])} events, 1 broker){extra}",
        f"`kcat -P` {_num(r['kcat_events_per_s'])} events/s",
        f"{r['ratio']:.2f}",
        "ratio ≥ 0.7",
        r["ratio"] >= 0.7,
    )


def _archive(r: Mapping[str, Any]) -> Row:
    # The first micro-batch pays the JVM's warm-up; the largest of the others shows the steady
    # rate (the last one may hold a handful of stragglers).
    warm_batches = sorted((r.get("batches") or [])[1:], key=lambda b: b["rows"])
    warm = f"; warm micro-batch {_num(warm_batches[-1]['rows_per_s'])}/s" if warm_batches else ""
    runs = len(r.get("archive_seconds") or [None])
    best = f", the better of {runs} runs" if runs > 1 else ""
    copies = len(r.get("copy_seconds") or [None])
    copy_best = f" (the better of {copies})" if copies > 1 else ""
    return Row(
        "archive",
        f"{_num(r['events_per_s'])} records/s ({_num(r['events'])} records{best}{warm})",
        f"plain Spark copy to Parquet {_num(r['copy_events_per_s'])} records/s{copy_best}",
        f"{r['ratio']:.2f}",
        "ratio ≥ 0.5",
        r["ratio"] >= 0.5,
    )


def _batch(r: Mapping[str, Any]) -> Row:
    runs = len(r.get("spark_runs_seconds") or [None])
    first = r.get("first_runs_ratio")
    best = f", the better of {runs} runs each; first runs' ratio {first:.2f}" if runs > 1 else ""
    plain = r.get("without_reach_seconds")
    reach = f"; without reach {plain:.1f} s" if plain is not None else ""
    return Row(
        "batch",
        f"{r['spark_seconds']:.1f} s (Spark batch job, {_num(r['events'])} events{best}{reach})",
        f"DuckDB {r['duckdb_seconds']:.1f} s, same view",
        f"{r['ratio']:.2f}",
        "ratio ≤ 2.5",
        r["ratio"] <= 2.5,
    )


def _speed(r: Mapping[str, Any]) -> Row:
    p95, api_p95 = r.get("p95_s"), r.get("api_p95_s")
    rates = [int(p["rate"]) for p in r.get("phases") or []]
    if r["highest_sustained_rate"]:
        sustained = f"sustained {_num(r['highest_sustained_rate'])} events/s"
    elif rates:
        sustained = f"lag kept flat at none of {_num(min(rates))}–{_num(max(rates))} events/s"
    else:
        sustained = "no sustained rate measured"
    measured = f"freshness at 5,000 events/s: committed p50 {r['p50_s']} s, p95 {p95} s"
    if api_p95 is not None:  # results from before issue 25 have no API figures
        measured += f"; through the API p50 {r.get('api_p50_s')} s, p95 {api_p95} s"
    measured += f"; {sustained}"
    if r.get("live_batch_ms_median") is not None:
        measured += f"; a 2,000-record micro-batch {_num(r['live_batch_ms_median'])} ms"
    met = (
        api_p95 is not None
        and api_p95 <= 2
        and r["highest_sustained_rate"] >= 20_000
        and (r.get("live_batch_ms_median") or 10**9) <= 1_000
    )
    return Row(
        "speed",
        measured,
        "—",
        "—",
        "API p95 ≤ 2 s; ≥ 20,000 events/s; batch ≤ 1 s",
        met,
    )


def _serving(r: Mapping[str, Any]) -> Row:
    api, floor = r["api"], r["duckdb_floor"]
    measured = (
        f"HTTP, {r['clients']} clients: p50 {api['p50_ms']:.1f} ms, p99 {api['p99_ms']:.1f} ms, "
        f"{_num(api['requests_per_s'])} req/s, {_num(api.get('errors', 0))} errors"
    )
    reference = f"in-process DuckDB p99 {floor['p99_ms']:.1f} ms"
    ratio = f"{r['p99_ratio']:.2f}"
    goal = "p99 ≤ 50 ms and ≤ 2× floor"
    met = api["p99_ms"] <= 50 and r["p99_ratio"] <= 2
    mix = r.get("distinct_mix")
    if mix:  # results from before issue 20 have no mix
        mix_api, mix_floor = mix["api"], mix["duckdb_floor"]
        measured += (
            f"; mix of {_num(mix['queries'])} distinct queries: p50 {mix_api['p50_ms']:.1f} ms, "
            f"p99 {mix_api['p99_ms']:.1f} ms, {_num(mix_api['requests_per_s'])} req/s, "
            f"{_num(mix_api.get('errors', 0))} errors, cache hit rate "
            f"{mix['cache_hit_rate']:.0%}"
        )
        reference += (
            f"; mix p50 {mix_floor['p50_ms']:.1f} ms, p99 {mix_floor['p99_ms']:.1f} ms, "
            f"{_num(mix_floor['requests_per_s'])} q/s"
        )
        ratio += f"; mix {mix['p99_ratio']:.2f}"
        goal += "; mix p99 ≤ 2× mix floor"
        met = met and mix["p99_ratio"] <= 2
    return Row("serving", measured, reference, ratio, goal, met)


def _reach(r: Mapping[str, Any]) -> Row:
    """The realistic lake's two queries of issue 69 against the goal, with the slowest query of
    each lake (results before issue 69 had the low-cardinality lake's queries only)."""
    lakes = r.get("lakes") or {"low cardinality": r}
    realistic = lakes.get("realistic", lakes["low cardinality"])["queries"]
    judged = {
        name: realistic[name]
        for name in ("the day per hour and campaign", "the day by campaign")
        if name in realistic
    } or realistic
    ratios = {name: q["with_ms"] / q["reference_scan_ms"] for name, q in judged.items()}
    parts = []
    for lake, result in lakes.items():
        queries = result["queries"]
        slowest = max(queries, key=lambda name: queries[name]["with_ms"])
        parts.append(f"{lake}: slowest {queries[slowest]['with_ms']:.0f} ms ({slowest})")
    measured = (
        "reach=true, one client: "
        + "; ".join(f"{name} {q['with_ms']:.0f} ms" for name, q in judged.items())
        + " ("
        + "; ".join(parts)
        + ")"
    )
    reference = (
        "DuckDB's exact distinct scan of the events: "
        + ", ".join(f"{q['reference_scan_ms']:.0f}" for q in judged.values())
        + " ms"
    )
    goal = "each ≤ 300 ms and ≤ 0.5× the scan"
    met = all(q["with_ms"] <= 300 for q in judged.values()) and max(ratios.values()) <= 0.5
    return Row("reach", measured, reference, f"{max(ratios.values()):.2f}", goal, met)


def _storage(r: Mapping[str, Any]) -> Row:
    steps = ("archive", "batch", "query")
    ratios = [r[step]["ratio"] for step in steps]
    return Row(
        "storage",
        f"lake on S3 (local SeaweedFS): archive {r['archive']['s3_s']:.1f} s, batch "
        f"{r['batch']['s3_s']:.1f} s, query {r['query']['s3_s'] * 1000:.0f} ms "
        f"({_num(r['events'])} events)",
        f"lake on local disk: {r['archive']['local_s']:.1f} s, {r['batch']['local_s']:.1f} s, "
        f"{r['query']['local_s'] * 1000:.0f} ms",
        " / ".join(f"{x:.2f}" for x in ratios),
        "each S3 / local ≤ 3",
        all(x <= 3 for x in ratios),
    )


def _scale(r: Mapping[str, Any]) -> Row:
    if "two_workers_speedup" not in r:  # the stream's half only (BENCH_SCALE_PARTS=stream)
        stream = r["stream"]
        return Row(
            "scale",
            f"the stream, two 1-core workers over one: x{stream['two_workers_speedup']}; to the "
            f"driver at most {stream['result_kib_per_million_max']:,.1f} KiB per million events",
            "one worker of one core",
            f"{stream['two_workers_speedup']}",
            "≥ 1.4; ≤ 100 KB per million",
            (stream["two_workers_speedup"] or 0) >= 1.4
            and stream["result_kib_per_million_max"] * 1.024 <= 100,
        )
    speedups = r["two_workers_speedup"]
    worst = min(speedups.values())
    kib = r["result_kib_per_million_max"]
    runs = r["runs"]
    largest = max(runs, key=lambda run: (run["workers"], run["events"]))
    return Row(
        "scale",
        f"two 1-core workers over one: {', '.join(f'x{v:.2f} at {k}' for k, v in speedups.items())}"
        f" ({_num(r['events'])} events = 1x); to the driver at most {kib:,.1f} KiB per million "
        f"events; driver CPU {largest['driver_cpu_seconds']:.1f} s at the largest",
        "one worker of one core",
        f"{worst:.2f}",
        "≥ 1.6; ≤ 100 KB per million",
        worst >= 1.6 and kib * 1.024 <= 100,
    )


def _passes(r: Mapping[str, Any]) -> Row:
    ratios: Mapping[str, float] = r["ratios"]
    small, large = r["days"]
    regular = {name: x for name, x in ratios.items() if "full VACUUM" not in name}
    worst = max(regular.values())
    return Row(
        "passes",
        f"each regular pass on a lake grown {small} → {large} days: "
        + ", ".join(f"{name} ×{x:.2f}" for name, x in ratios.items()),
        f"the same passes on the {small}-day lake",
        f"{worst:.2f} (the largest)",
        "≤ 1.5×",
        worst <= 1.5,  # the goal
    )


def _alerts(r: Mapping[str, Any]) -> Row:
    truth, cost = r["truth"], r["cost"]
    changes = {
        (c["change"], c["rule"].rsplit("-", 1)[-1]): c
        for c in truth["changes"]
        if not c["rule"].startswith("threshold-")
    }
    drop, broken = changes[("ctr drop", "ads")], changes[("tracking break", "ctr")]
    tallies = truth["tallies"]
    ours = [t for name, t in tallies.items() if not name.startswith("threshold")]
    naive = [t for name, t in tallies.items() if name.startswith("threshold")]
    noise = sum(t["false_alarms_noise"] for t in ours)
    misses = sum(t["misses"] for t in ours)
    median = cost["median"]
    return Row(
        "alerts",
        f"{_num(cost['rules'])} rules per minute: {median['cpu_s']:.2f} CPU s "
        f"({cost['core_share']:.1%} of a core; DuckDB {median['duckdb_cpu_s']:.2f} s, Python "
        f"{median['python_cpu_s']:.2f} s); over {truth['hours']} simulated h: 30 % drop fired "
        f"after {drop['delay_minutes']} min, tracking break after {broken['delay_minutes']} min, "
        f"{misses} misses, {noise} false alarms on noise campaigns "
        f"({sum(t['false_alarms_other'] for t in ours)} elsewhere)",
        f"threshold rule (± 20 %): {sum(t['false_alarms_noise'] for t in naive)} false alarms on "
        f"noise campaigns, {sum(t['false_alarms_other'] for t in naive)} elsewhere",
        f"{cost['core_share']:.3f}",
        "≤ 10 % of a core; 0 misses, 0 noise alarms",
        cost["core_share"] <= 0.10 and misses == 0 and noise == 0,
    )


def _sql_wire(r: Mapping[str, Any]) -> Row:
    return Row(
        "sql-wire",
        f"a small query over PostgreSQL's protocol (psycopg, bound parameters): p50 "
        f"{r['wire_p50_ms']:.1f} ms, p95 {r['wire_p95_ms']:.1f} ms ({r['rounds']} rounds of 3 "
        "queries, one client)",
        f"the same over POST /api/v1/sql: p50 {r['http_p50_ms']:.1f} ms, p95 "
        f"{r['http_p95_ms']:.1f} ms",
        f"{r['ratio_p50']:.2f}",
        "≤ 1.5× the HTTP API's p50",
        r["ratio_p50"] <= 1.5 and bool(r["same_row_counts"]),
    )


SUMMARIES: dict[str, Callable[[Mapping[str, Any]], Row]] = {
    "ingest": _ingest,
    "archive": _archive,
    "batch": _batch,
    "scale": _scale,
    "passes": _passes,
    "speed": _speed,
    "serving": _serving,
    "beside-batch": _beside_batch,
    "replicas": _replicas,
    "reach": _reach,
    "storage": _storage,
    "alerts": _alerts,
    "state": _state,
    "sql-wire": _sql_wire,
}


def summarize(name: str, result: Mapping[str, Any] | None, error: str | None = None) -> Row:
    """The row for one benchmark; a result missing a figure is reported, not raised."""
    if result is None:
        return Row(name, f"failed: {error}" if error else "not run", "—", "—", "", None)
    try:
        return SUMMARIES[name](result)
    except (KeyError, TypeError, ValueError) as exc:
        return Row(name, f"unreadable result ({type(exc).__name__}: {exc})", "—", "—", "", None)


def machine() -> dict[str, str]:
    """What the figures were measured on."""

    def first(path: str, prefix: str) -> str | None:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip() if ":" in line else line
        except OSError:
            return None
        return None

    memory = first("/proc/meminfo", "MemTotal")
    os_name = first("/etc/os-release", "PRETTY_NAME=")
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    java_line = (java.stderr or java.stdout).splitlines()[:1]

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpu": first("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "memory": f"{int(memory.split()[0]) / 1024**2:.0f} GiB" if memory else "unknown",
        "os": (os_name.split("=", 1)[1].strip('"') if os_name else platform.platform()),
        "python": platform.python_version(),
        "java": java_line[0] if java_line else "unknown",
        "pyspark": version("pyspark"),
        "duckdb": version("duckdb"),
        "deltalake": version("deltalake"),
    }


def load(results: Path = RESULTS) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """name -> (result, error) for every benchmark with a file in ``results``."""
    found: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    for name in ORDER:
        result_file, error_file = results / f"{name}.json", results / f"{name}.error.json"
        if result_file.exists():
            found[name] = (json.loads(result_file.read_text()), None)
        elif error_file.exists():
            found[name] = (None, json.loads(error_file.read_text()).get("error", "unknown error"))
    return found


def record_failure(name: str, error: BaseException, results: Path = RESULTS) -> None:
    """Replace a benchmark's last result by its failure, so the table never shows stale figures
    for a run that broke."""
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").unlink(missing_ok=True)
    text = f"{type(error).__name__}: {error}".strip()
    (results / f"{name}.error.json").write_text(json.dumps({"error": text}, indent=2) + "\n")


def clear_failure(name: str, results: Path = RESULTS) -> None:
    (results / f"{name}.error.json").unlink(missing_ok=True)


def table(rows: list[Row]) -> str:
    lines = [
        "| benchmark | measured | reference | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: "—"}[row.met]
        cells = [row.benchmark, row.measured, row.reference, row.ratio, row.goal, met]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def markdown(rows: list[Row], host: Mapping[str, str], when: str) -> str:
    described = (
        f"{host['cpu']}, {host['cores']} cores, {host['memory']}, {host['os']}; Python "
        f"{host['python']}, {host['java']}, pyspark {host['pyspark']}, duckdb {host['duckdb']}, "
        f"deltalake {host['deltalake']}"
    )
    return f"{table(rows)}\n\nMeasured {when} on: {described}.\n"


def update_page(page: Path, block: str) -> bool:
    """Put ``block`` between the page's table markers; False when the markers are missing."""
    text = page.read_text()
    pattern = re.compile(re.escape(TABLE_START) + r".*?" + re.escape(TABLE_END), re.DOTALL)
    if not pattern.search(text):
        return False
    replaced = pattern.sub(lambda _: f"{TABLE_START}\n{block}{TABLE_END}", text, count=1)
    page.write_text(replaced)
    return True


def _with_page_rows(block: str, rows: list[Row], text: str) -> str:
    """``block`` (the table of ``rows`` and its machine line) with the page's own rows of the
    benchmarks that have no result here, in :data:`ORDER`: the results are files of the
    machine that ran them, so a benchmark run alone on a fresh checkout keeps the others' rows
    the page has (and says which), rather than dropping them."""
    fresh = {row.benchmark for row in rows}
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    kept = {}
    if 0 <= start < end:
        for line in text[start:end].splitlines():
            name = line.split("|")[1].strip() if line.startswith("| ") else ""
            if name in ORDER and name not in fresh:
                kept[name] = line
    if not kept:
        return block
    lines = block.splitlines()
    body = {line.split("|")[1].strip(): line for line in lines[2:] if line.startswith("| ")}
    ordered = [body.get(name) or kept.get(name) for name in ORDER]
    table_lines = [*lines[:2], *(line for line in ordered if line)]
    rest = lines[2 + len(body) :]
    note = (
        f"The rows of {', '.join(kept)} are the page's as they were (no result of theirs "
        "in this run's bench/results): see their sections for when and where they were measured."
    )
    return "\n".join([*table_lines, *rest, "", note]) + "\n"


def write(results: Path = RESULTS, page: Path | None = PAGE) -> list[Row]:
    """Build RESULTS.md and results.json from the per-benchmark files (and the docs page's
    table)."""
    found = load(results)
    rows = [summarize(name, *found[name]) for name in ORDER if name in found]
    host = machine()
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = markdown(rows, host, when)
    page_block = block
    if page is not None and page.exists():
        page_block = _with_page_rows(block, rows, page.read_text())
    results.mkdir(parents=True, exist_ok=True)
    (results / "RESULTS.md").write_text(f"# Benchmark results\n\n{block}")
    payload = {
        "generated": when,
        "machine": host,
        "rows": [row.__dict__ for row in rows],
        "results": {name: result for name, (result, _) in found.items() if result is not None},
        "failures": {name: error for name, (_, error) in found.items() if error is not None},
    }
    (results / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    if page is not None and page.exists() and not update_page(page, page_block):
        print(f"bench: {page} has no {TABLE_START} marker; the table is only in {results}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="default: %(default)s")
    parser.add_argument("--no-page", action="store_true", help=f"leave {PAGE} alone")
    args = parser.parse_args(argv)
    if not load(args.results):
        print(f"bench: no results in {args.results}; run `make bench` first", file=sys.stderr)
        return 1
    rows = write(args.results, None if args.no_page else PAGE)
    print(table(rows))
    print(f"\nbench: wrote {args.results / 'RESULTS.md'} and {args.results / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
