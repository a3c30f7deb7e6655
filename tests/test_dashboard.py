"""The dashboard in headless Chromium, against the real API over Delta tables the test writes.

The lake holds 50 minutes ending now: batch rows and a finished run covering the first 30,
speed rows for the last 30 (the 10 minutes they overlap are covered, so the page must show the
batch numbers there). The page has to show exactly those buckets with their provenance.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from api.settings import ApiSettings
from infra.browser import CHROMIUM_MISSING, Page, chromium_binary, chromium_page
from lake.settings import LakeSettings
from tests import lake_writer
from tests.api_server import running_api
from views.columns import DIMENSIONS

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "dashboard-test-token"
MINUTE = dt.timedelta(minutes=1)
# (campaign, ad, site, country, device) of the rows written for every minute.
KEYS = [
    ("c1", "a1", "s1", "US", "mobile"),
    ("c2", "a2", "s1", "DE", "desktop"),
    ("c3", "a3", "s2", "FR", "mobile"),
]


def _counts(minute: int, key: int, layer: str) -> tuple[int, int]:
    """Impressions and clicks of one row (`minute`: minutes since the epoch); speed differs
    from batch so a wrong merge shows."""
    minute %= 60
    impressions = 100 + 40 * key + minute
    clicks = (minute * (key + 2)) % 9 + key + 1
    return (impressions + 7, clicks + 1) if layer == "speed" else (impressions, clicks)


def _rows(buckets: list[dt.datetime], layer: str) -> list[dict[str, object]]:
    rows = []
    for bucket in buckets:
        for k, (campaign, ad, site, country, device) in enumerate(KEYS):
            impressions, clicks = _counts(int(bucket.timestamp() // 60), k, layer)
            rows.append(
                lake_writer.ctr_row(
                    bucket,
                    impressions,
                    clicks,
                    campaign=campaign,
                    ad=ad,
                    site=site,
                    country=country,
                    device=device,
                )
            )
    return rows


class Lake:
    """The Delta tables of the test and the per-minute numbers the page must show."""

    def __init__(self, root: Path, now: dt.datetime) -> None:
        self.settings = LakeSettings(lake_root=root, checkpoint_root=root / "checkpoints")
        self.now = now.replace(second=0, microsecond=0)
        self.batch_minutes = [self.now - (50 - i) * MINUTE for i in range(30)]  # [T-50, T-20)
        self.speed_minutes = [self.now - (30 - i) * MINUTE for i in range(31)]  # [T-30, T]
        self.covered_end = self.batch_minutes[-1] + MINUTE

    def write(self) -> None:
        run_id = "run-dashboard-test"
        lake_writer.write_batch(self.settings, run_id, _rows(self.batch_minutes, "batch"))
        lake_writer.cover(self.settings, run_id, self.batch_minutes[0], self.covered_end)
        lake_writer.write_speed(self.settings, _rows(self.speed_minutes, "speed"))
        lake_writer.write_status(
            self.settings,
            updated_at=dt.datetime.now(dt.UTC).isoformat(),
            watermark=(self.now - 2 * MINUTE).isoformat(),
            offsets_behind=1234,
        )

    def expected_series(self) -> list[list[Any]]:
        """[bucket ms, source, impressions, clicks] per minute with data, as the page holds it."""
        out = []
        for bucket in sorted(set(self.batch_minutes) | set(self.speed_minutes)):
            layer = "batch" if bucket < self.covered_end else "speed"
            minute = int(bucket.timestamp() // 60)
            counts = [_counts(minute, k, layer) for k in range(len(KEYS))]
            out.append(
                [
                    int(bucket.timestamp() * 1000),
                    layer,
                    sum(c[0] for c in counts),
                    sum(c[1] for c in counts),
                ]
            )
        return out

    def expected_ranking(self, dimension: str) -> list[str]:
        """Values of `dimension` by total clicks over the data, most first (ties by name)."""
        clicks: dict[str, int] = {}
        impressions: dict[str, int] = {}
        for bucket in sorted(set(self.batch_minutes) | set(self.speed_minutes)):
            layer = "batch" if bucket < self.covered_end else "speed"
            minute = int(bucket.timestamp() // 60)
            for k, key in enumerate(KEYS):
                value = key[DIMENSIONS.index(dimension)]
                i, c = _counts(minute, k, layer)
                clicks[value] = clicks.get(value, 0) + c
                impressions[value] = impressions.get(value, 0) + i
        return sorted(clicks, key=lambda v: (-clicks[v], -impressions[v], v))


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    # Far enough from a minute's end that the page's "last hour" holds every bucket written.
    now = dt.datetime.now(dt.UTC)
    if now.second > 50:
        time.sleep(61 - now.second)
        now = dt.datetime.now(dt.UTC)
    lake = Lake(tmp_path / "lake", now)
    lake.write()
    return lake


@pytest.fixture
def api_url(lake: Lake) -> Iterator[str]:
    """The real API (``api.main.create_app``) under uvicorn on a free loopback port."""
    with running_api(ApiSettings(token=SecretStr(TOKEN)), lake.settings) as url:
        yield url


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    if chromium_binary() is None:
        pytest.fail(CHROMIUM_MISSING)
    with chromium_page(tmp_path / "chromium") as page:
        yield page
    assert page.exceptions == [], f"the page threw: {page.exceptions}"


def _api(url: str, path: str) -> Any:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def _bucket_text(value: str) -> str:
    stamp = dt.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


STATE = "document.body.dataset.state"
SERIES = """ctrDashboard.state.series.filter((s) => s.row)
    .map((s) => [s.t, s.row.source, s.row.impressions, s.row.clicks])"""
# Points and bars Chart.js laid out inside the chart area, per chart.
DRAWN = """(() => {
  const c = ctrDashboard.charts;
  const inside = (chart, i) => {
    const a = chart.chartArea;
    const values = chart.data.datasets[i].data.map((v) => (typeof v === "object" ? v.y : v));
    return chart.getDatasetMeta(i).data.filter((el, j) => values[j] !== null
      && !el.skip && Number.isFinite(el.y)
      && el.x >= a.left - 1 && el.x <= a.right + 1
      && el.y >= a.top - 1 && el.y <= a.bottom + 1).length;
  };
  return { ctr: inside(c.series.ctr, 0), clicks: inside(c.series.volume, 0),
           impressions: inside(c.series.volume, 1), campaigns: inside(c.campaign_id.chart, 0),
           countries: inside(c.country.chart, 0), devices: inside(c.device_type.chart, 0) };
})()"""
# Alpha of the canvas pixel at the middle of every campaign bar: painted, not just laid out.
BAR_PIXELS = """(() => {
  const chart = ctrDashboard.charts.campaign_id.chart;
  const g = chart.canvas.getContext("2d");
  const r = window.devicePixelRatio;
  return chart.getDatasetMeta(0).data.map((bar) => {
    const x = Math.round(((bar.x + bar.base) / 2) * r), y = Math.round(bar.y * r);
    return g.getImageData(x, y, 1, 1).data[3];
  });
})()"""


def test_dashboard_renders_the_merged_view(
    api_url: str, lake: Lake, page: Page, tmp_path: Path
) -> None:
    # No token yet: the page asks for one instead of failing silently.
    page.navigate(f"{api_url}/")
    page.wait_for(f"{STATE} === 'token' && document.getElementById('token-dialog').open")

    # A wrong token from the URL fragment: 401, asked again; the fragment leaves the address bar.
    page.navigate("about:blank")
    page.navigate(f"{api_url}/#token=wrong")
    reason = page.wait_for(
        f"{STATE} === 'token' && document.getElementById('token-reason').textContent"
    )
    assert "401" in reason
    assert page.evaluate("location.hash") == ""

    # The right token through the dialog: the charts load.
    page.evaluate(
        f"""document.getElementById('token-input').value = {json.dumps(TOKEN)};
        document.getElementById('token-form').requestSubmit()"""
    )
    page.wait_for(f"{STATE} === 'ready'")
    assert page.evaluate("localStorage.getItem('ctr-lambda.api-token')") == TOKEN
    assert page.evaluate(
        "ctrDashboard.state.view.name + ' ' + ctrDashboard.state.view.granularity"
    ) == ("1h minute")

    # Every bucket with data, with its provenance and counts: batch where covered, else speed.
    expected = lake.expected_series()
    assert page.evaluate(SERIES) == expected
    ctr_points = page.evaluate(
        "ctrDashboard.charts.series.ctr.data.datasets[0].data.filter((p) => p.y !== null)"
    )
    assert [[p["x"], p["y"]] for p in ctr_points] == [
        [t, pytest.approx(clicks / impressions)] for t, _, impressions, clicks in expected
    ]
    assert page.evaluate(DRAWN) == {
        "ctr": len(expected),
        "clicks": len(expected),
        "impressions": len(expected),
        "campaigns": 3,
        "countries": 3,
        "devices": 2,
    }
    assert page.evaluate("ctrDashboard.charts.campaign_id.chart.data.labels") == (
        lake.expected_ranking("campaign_id")
    )
    assert page.evaluate("ctrDashboard.charts.country.chart.data.labels") == (
        lake.expected_ranking("country")
    )
    assert page.evaluate("ctrDashboard.charts.device_type.chart.data.labels") == (
        lake.expected_ranking("device_type")
    )
    assert all(alpha > 0 for alpha in page.evaluate(BAR_PIXELS))

    # The provenance legend and the freshness indicator, as the API reports freshness.
    legend = page.evaluate("document.getElementById('provenance-legend').innerText")
    assert re.findall(r"exact \(batch\)|approximate \(speed\)|mixed", legend) == [
        "exact (batch)",
        "approximate (speed)",
        "mixed",
    ]
    summary = page.evaluate("document.getElementById('ctr-summary').textContent")
    assert summary == "· minute buckets: 30 exact (batch), 21 approximate (speed)"
    freshness = _api(api_url, "/api/v1/ctr?" + _window(lake))["freshness"]
    shown = page.evaluate(
        "['fresh-batch', 'fresh-speed', 'fresh-lag', 'fresh-stream']"
        ".map((id) => document.getElementById(id).textContent)"
    )
    assert freshness["speed_lag_records"] == 1234
    assert shown[:3] == [
        _bucket_text(freshness["latest_covered_bucket"]),
        _bucket_text(freshness["latest_speed_bucket"]),
        "1,234 records",
    ]
    assert re.fullmatch(r"\d+ s ago", shown[3]), shown[3]

    # Screenshot of the loaded page, kept as a test artifact.
    shot = page.screenshot(tmp_path / "dashboard.png")
    for target in (os.environ.get("CTR_ARTIFACTS"), os.environ.get("CTR_DASHBOARD_SCREENSHOT")):
        if target:
            destination = Path(target)
            if destination.suffix != ".png":
                destination = destination / "dashboard.png"
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, destination)

    # Auto-refresh: a new campaign streams in and takes the lead without a reload.
    refreshes = page.evaluate("ctrDashboard.state.refreshes")
    late = [lake.now - 2 * MINUTE]
    _write_leader(lake, late)
    page.wait_for(
        f"ctrDashboard.state.refreshes > {refreshes} && "
        "ctrDashboard.charts.campaign_id.chart.data.labels[0] === 'c9'",
        timeout=20,
    )

    # No refresh failed on the way, new table versions included (a failed refresh shows a
    # banner and retries 5 s later, so waiting for "ready" alone would hide it).
    assert page.evaluate("ctrDashboard.state.failures") == []

    # The network goes away: said on the page, last charts kept; it comes back: recovered.
    page.set_offline(True)
    page.evaluate("document.getElementById('refresh-now').click()")
    error = page.wait_for(f"{STATE} === 'error' && document.getElementById('error').textContent")
    assert "cannot reach the API" in error
    assert page.evaluate(SERIES)[0] == expected[0]
    page.set_offline(False)
    page.evaluate("document.getElementById('refresh-now').click()")
    page.wait_for(f"{STATE} === 'ready' && document.getElementById('error').hidden")


def _window(lake: Lake) -> str:
    start = (lake.now - 59 * MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = (lake.now + MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"start={start}&end={end}&granularity=minute"


def _write_leader(lake: Lake, minutes: list[dt.datetime]) -> None:
    """Speed rows of campaign c9 with more clicks than any other campaign in the range."""
    rows = [
        lake_writer.ctr_row(at, 5_000, 600, campaign="c9", ad="a9", site="s9", device="tablet")
        for at in minutes
    ]
    lake_writer.write_speed(lake.settings, rows)


def test_vendored_chart_library_is_the_locked_version() -> None:
    lock = json.loads((ROOT / "dashboard/package-lock.json").read_text())
    locked = lock["packages"]["node_modules/chart.js"]["version"]
    banner = (ROOT / "api/static/vendor/chart.umd.min.js").read_text()[:200]
    assert f"Chart.js v{locked}\n" in banner, (
        "api/static/vendor/chart.umd.min.js is not the Chart.js version pinned in "
        "dashboard/package-lock.json: run `make dashboard` and commit the result"
    )
