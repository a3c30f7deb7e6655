"""`python -m bench [NAME ...]`: run benchmarks (all by default) and print their figures."""

from __future__ import annotations

import argparse
import sys

from bench import archive, batch, ingest, serving

BENCHMARKS = {
    "ingest": ingest.main,
    "archive": archive.main,
    "batch": batch.main,
    "serving": serving.main,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="default: all")
    parser.add_argument("--events", type=int, help="events per run (default: each benchmark's)")
    args = parser.parse_args(argv)
    for name in args.names or list(BENCHMARKS):
        BENCHMARKS[name](events=args.events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
