"""``python -m infra.soak`` (`make soak`): the settings read from the environment, here only,
then one soak, or with ``--report-only`` the report rebuilt from a soak's samples."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import infra.soak
from infra.soak.config import Config
from infra.soak.console import log
from infra.soak.report import plot, publish, read_samples, table_markdown
from infra.soak.rules import verdicts
from infra.soak.run import run


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infra.soak",
        description=(infra.soak.__doc__ or "").split("\n\n")[0],
        epilog="Settings come from the environment: SOAK_MINUTES, SOAK_RATE, CHAOS, "
        "SOAK_SAMPLE_S, SOAK_KILL_EVERY_S, SOAK_SEED, RUN_DIR, and SOAK_DOCS: where the report "
        "is published as a page of the docs site (default docs/soak; 0: not published).",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild report tables and plots from RUN_DIR/soak/samples.csv, run nothing",
    )
    args = parser.parse_args()
    config = Config.from_env(os.environ)
    if args.report_only:
        samples = read_samples(config.out / "samples.csv")
        duration = max(t for t, _, _ in samples)
        print(table_markdown(verdicts(samples, duration)))
        plot(samples, config.out)
        return
    status = run(config)
    #: Folder the report goes to as the docs site's soak page (report.md, or chaos.md with
    #: CHAOS=1); 0: not published.
    docs = os.environ.get("SOAK_DOCS", "docs/soak")
    if docs != "0" and (config.out / "report.md").exists():
        log(f"report published: {publish(config.out, Path(docs), chaos=config.chaos)}")
    sys.exit(status)


if __name__ == "__main__":
    main()
