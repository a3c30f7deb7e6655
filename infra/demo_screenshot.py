"""`make demo-screenshot`: pictures of the running demo's dashboard, for the README and
the docs site.

Opens the dashboard of `make demo` in headless Chromium (the DevTools driver of the dashboard
tests, `infra/browser.py`) at each view's URL (the page keeps its view in the query string),
waits until its charts have loaded and drawn, and saves a screenshot of the view's part of the
page: the page down to its table (docs/demo.png), the filters at work
(docs/dashboard-filters.png), a comparison (docs/dashboard-compare.png) and the table
(docs/dashboard-table.png).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infra.browser import BrowserError, Page, chromium_page
from infra.demo_settings import DemoSettings

SETTLED = (
    "ctrDashboard.state.shown === ctrDashboard.state.generation"
    " && document.body.dataset.state === 'ready'"
)


@dataclass(frozen=True)
class Shot:
    name: str  # the file under the output folder
    query: str  # the dashboard's view, as its URL's query string
    clip_to: tuple[str, ...] = ()  # CSS selectors of what to show; () = the whole page


SHOTS = (
    Shot("demo.png", "range=1h", (".topbar", ".table-card")),
    Shot(
        "dashboard-filters.png",
        "range=1h&country=US&country=DE&device_type=mobile",
        (".topbar", ".filters", ".status", ".totals", "#chart-campaign", "#chart-device"),
    ),
    Shot(
        "dashboard-compare.png",
        "range=1h&compare=country&compare_value=US&compare_value=DE&compare_value=IN",
        (".filters", "#chart-ctr"),
    ),
    Shot(
        "dashboard-table.png",
        "range=1h&device_type=ctv&table_by=campaign_id,country",
        (".table-card",),
    ),
)


def capture(page: Page, url: str, shot: Shot, output: Path, settle_s: float = 3.0) -> Path:
    """Screenshot of the dashboard at ``url`` showing ``shot``'s view with data."""
    page.navigate(f"{url}/?{shot.query}")
    page.wait_for(SETTLED, timeout=60)
    page.wait_for("ctrDashboard.state.series.some((s) => s.row)", timeout=60)
    time.sleep(settle_s)  # let the charts finish drawing
    return page.screenshot(output / shot.name, clip_to=shot.clip_to)


def main() -> None:
    demo = DemoSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, nargs="?", default=Path("docs"), help="a folder")
    parser.add_argument("--url", default=f"http://127.0.0.1:{demo.api_port}", help="the API")
    parser.add_argument("--token-file", type=Path, default=demo.token_file, help="the API token")
    args = parser.parse_args()
    if not args.token_file.is_file():
        sys.exit(f"error: no API token at {args.token_file}: is `make demo` running?")
    token = args.token_file.read_text().strip()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="ctr-demo-shot-") as profile,
            chromium_page(Path(profile), width=1400, height=1000) as page,
        ):
            page.navigate(f"{args.url}/#token={token}")  # the page keeps the token
            page.wait_for(SETTLED, timeout=60)
            for shot in SHOTS:
                print(f"dashboard of {args.url} -> {capture(page, args.url, shot, args.output)}")
    except (BrowserError, OSError) as exc:
        sys.exit(f"error: no screenshot of {args.url}: {exc}")


if __name__ == "__main__":
    main()
