"""`make demo-screenshot`: a picture of the running demo's dashboard (docs/demo.png).

Opens the dashboard of `make demo` in headless Chromium (the DevTools driver of the dashboard
test, `infra/browser.py`), waits until the charts have loaded and drawn, and saves a screenshot.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from infra.browser import BrowserError, chromium_page
from infra.demo_settings import DemoSettings

STATE = "document.body.dataset.state"


def capture(url: str, token: str, output: Path, view: str = "15m", settle_s: float = 3.0) -> Path:
    """Screenshot of the dashboard at ``url`` showing ``view`` (a range button) with data."""
    with (
        tempfile.TemporaryDirectory(prefix="ctr-demo-shot-") as profile,
        chromium_page(Path(profile), width=1400, height=1000) as page,
    ):
        page.navigate(f"{url}/#token={token}")
        page.wait_for(f"{STATE} === 'ready'", timeout=60)
        page.evaluate(f"document.querySelector('[data-range={json.dumps(view)}]').click()")
        page.wait_for(
            f"{STATE} === 'ready' && ctrDashboard.state.view.name === {json.dumps(view)}",
            timeout=60,
        )
        page.wait_for("ctrDashboard.state.series.some((s) => s.row)", timeout=60)
        time.sleep(settle_s)  # chart animations
        return page.screenshot(output)


def main() -> None:
    demo = DemoSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, nargs="?", default=Path("docs/demo.png"))
    parser.add_argument("--url", default=f"http://127.0.0.1:{demo.api_port}", help="the API")
    parser.add_argument("--token-file", type=Path, default=demo.token_file, help="the API token")
    parser.add_argument("--view", default="15m", help="the range button: 15m, 1h, 6h or 24h")
    args = parser.parse_args()
    if not args.token_file.is_file():
        sys.exit(f"error: no API token at {args.token_file}: is `make demo` running?")
    try:
        shot = capture(args.url, args.token_file.read_text().strip(), args.output, args.view)
    except (BrowserError, OSError) as exc:
        sys.exit(f"error: no screenshot of {args.url}: {exc}")
    print(f"dashboard of {args.url} -> {shot}")


if __name__ == "__main__":
    main()
