"""`python -m bench [NAME ...]`: run benchmarks (all by default), print their figures, and write
the results table (bench/results/RESULTS.md and results.json, and the docs site's performance
page, docs/performance.md).

A benchmark that fails is reported and recorded as failed; the others still run. The exit
status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

from bench import (
    alerts,
    archive,
    batch,
    ingest,
    passes,
    reach,
    refresh,
    replicas,
    report,
    scale,
    serving,
    serving_beside_batch,
    speed,
    sql_wire,
    state,
    storage,
)

BENCHMARKS = {
    "ingest": ingest.main,
    "archive": archive.main,
    "batch": batch.main,
    "scale": scale.main,
    "passes": passes.main,
    "speed": speed.main,
    "serving": serving.main,
    "beside-batch": serving_beside_batch.main,
    "replicas": replicas.main,
    "reach": reach.main,
    "storage": storage.main,
    "alerts": alerts.main,
    "state": state.main,
    "refresh": refresh.main,
    "sql-wire": sql_wire.main,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="default: all")
    parser.add_argument("--events", type=int, help="events per run (default: each benchmark's)")
    parser.add_argument(
        "--no-page", action="store_true", help="leave docs/performance.md's table alone"
    )
    args = parser.parse_args(argv)
    failed = []
    for name in args.names or list(BENCHMARKS):
        started = time.monotonic()
        print(f"=== bench {name}", flush=True)
        try:
            BENCHMARKS[name](events=args.events)
        except (Exception, SystemExit) as exc:  # one broken benchmark must not hide the rest
            traceback.print_exc()
            print(f"=== bench {name}: FAILED ({type(exc).__name__}: {exc})", flush=True)
            report.record_failure(name, exc)
            failed.append(name)
            continue
        report.clear_failure(name)
        print(f"=== bench {name}: done in {time.monotonic() - started:.0f} s", flush=True)
    rows = report.write(page=None if args.no_page else report.PAGE)
    print("\n" + report.table(rows))
    print(f"\nbench: results in {report.RESULTS}/RESULTS.md and results.json"
          + ("" if args.no_page else f"; {report.PAGE}'s table updated"))  # fmt: skip
    if failed:
        print(f"bench: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
