"""The dashboard in headless Chromium, against the real API over Delta tables the test writes
(:mod:`tests.support.dashboard_lake`): every bucket with its provenance, the breakdowns, what
/api/v1/views says of stale buckets and the speed layer's drift, the token prompt, auto-refresh
and the offline message. The analyst's controls (filters, comparison, table, shared URLs) are
in ``test_dashboard_analyst.py``."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from infra.browser import Page
from tests.support import ROOT, lake_writer
from tests.support.dashboard_lake import KEYS, MINUTE, TOKEN, Lake


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
# The stale notice and the drift panel as shown: text, or null for what is hidden.
EXACTNESS = """(() => {
  const el = (id) => document.getElementById(id);
  const shown = (id) => el(id).getClientRects().length > 0;
  const text = (id) => el(id).textContent.replace(/\\s+/g, " ").trim();
  const table = [...document.querySelectorAll("#drift-table tr")]
    .map((tr) => [...tr.cells].map((c) => c.textContent));
  return {
    stale: text("fresh-stale"),
    staleIntervals: shown("stale-detail") ? text("stale-intervals") : null,
    drift: shown("drift-empty") ? text("drift-empty") : text("drift-title"),
    driftTable: shown("drift-figures") ? table : null,
  };
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
    dashboard_url: str, dashboard_lake: Lake, page: Page, tmp_path: Path
) -> None:
    # No token yet: the page asks for one instead of failing silently.
    page.navigate(f"{dashboard_url}/")
    page.wait_for(f"{STATE} === 'token' && document.getElementById('token-dialog').open")

    # A wrong token from the URL fragment: 401, asked again; the fragment leaves the address bar.
    page.navigate("about:blank")
    page.navigate(f"{dashboard_url}/#token=wrong")
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
    expected = dashboard_lake.expected_series()
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
        dashboard_lake.expected_ranking("campaign_id")
    )
    assert page.evaluate("ctrDashboard.charts.country.chart.data.labels") == (
        dashboard_lake.expected_ranking("country")
    )
    assert page.evaluate("ctrDashboard.charts.device_type.chart.data.labels") == (
        dashboard_lake.expected_ranking("device_type")
    )
    assert all(alpha > 0 for alpha in page.evaluate(BAR_PIXELS))

    # The provenance legend and the freshness indicator, as the API reports freshness.
    legend = page.evaluate("document.getElementById('provenance-legend').innerText")
    assert re.findall(r"exact \(batch\)|stale \([^)]*\)|approximate \(speed\)|mixed", legend) == [
        "exact (batch)",
        "stale (late events not yet recomputed)",
        "approximate (speed)",
        "mixed",
    ]
    summary = page.evaluate("document.getElementById('ctr-summary').textContent")
    assert summary == "· minute buckets: 30 exact (batch), 21 approximate (speed)"
    # Nothing stale, no drift recorded (no batch/drift table).
    assert page.evaluate(EXACTNESS) == {
        "stale": "none",
        "staleIntervals": None,
        "drift": "No drift recorded yet: no batch run has covered minutes the speed layer counted.",
        "driftTable": None,
    }
    freshness = _api(dashboard_url, "/api/v1/ctr?" + _window(dashboard_lake))["freshness"]
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
    late = [dashboard_lake.now - 2 * MINUTE]
    _write_leader(dashboard_lake, late)
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


# The tooltip lines a chart shows for one of its elements, as if the pointer were on it.
TOOLTIP = """((chart, index) => {
  const el = chart.getDatasetMeta(0).data[index];
  chart.tooltip.setActiveElements([{ datasetIndex: 0, index }], { x: el.x, y: el.y });
  const t = chart.tooltip;
  return [...t.beforeBody, ...t.body.flatMap((b) => b.lines), ...t.afterBody];
})"""
# The marks of the buckets at indexes `i` of the series: CTR point style, impressions bar fill.
MARKS = """((i) => {
  const c = ctrDashboard.charts.series;
  const fill = (j) => c.volume.getDatasetMeta(1).data[j].options.backgroundColor;
  return { point: c.ctr.getDatasetMeta(0).data[i].options.pointStyle, fill: fill(i) };
})"""


def _drift_row(
    run: str, bucket: dt.datetime, speed: tuple[int, int], batch: tuple[int, int]
) -> dict[str, object]:
    return {
        "run_id": run,
        "view": "ctr",
        "bucket_start": bucket,
        "speed_impressions": speed[0],
        "speed_clicks": speed[1],
        "batch_impressions": batch[0],
        "batch_clicks": batch[1],
        "recorded_at": bucket + dt.timedelta(hours=1),
    }


def _interval_text(start: dt.datetime, end: dt.datetime) -> str:
    to = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"{start:%Y-%m-%d %H:%M}–{to} UTC"


def test_dashboard_marks_stale_buckets_and_shows_the_drift(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    # 9 impressions and a click of campaign c1 archived after the run covering their minute
    # (it read master/events v1): the minute is stale, its 10 late events added to the batch
    # counts.
    stale = dashboard_lake.batch_minutes[5]
    c1 = dict(zip(("campaign", "ad", "site", "country", "device"), KEYS[0], strict=True))
    lake_writer.write_arrivals(dashboard_lake.settings, 2, [lake_writer.ctr_row(stale, 9, 1, **c1)])
    # Two runs compared three minutes. Per event: impressions (10 + 0 + 4) / (100 + 50 + 200)
    # = 4 %, clicks (0 + 1 + 1) / (10 + 5 + 10) = 8 %. Per minute, the minutes of 100 or more
    # batch events only: impressions 10/100 and 4/200 (not 0/50): p50 6 %, p99 0.02 + 0.99 *
    # 0.08 = 9.92 %; clicks: no minute of 100 clicks, no percentile. Speed minus batch:
    # impressions 10 + 0 + 4 = +14 (duplicates), clicks 0 - 1 - 1 = -2.
    minutes = dashboard_lake.batch_minutes
    lake_writer.write(
        dashboard_lake.settings,
        "batch/drift",
        [
            _drift_row("run-1", minutes[0], (110, 10), (100, 10)),
            _drift_row("run-1", minutes[1], (50, 4), (50, 5)),
            _drift_row("run-2", minutes[2], (204, 9), (200, 10)),
        ],
    )

    page.navigate(f"{dashboard_url}/#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready'")

    # The stale minute: batch counts plus the late events, marked stale.
    stale_ms = int(stale.timestamp() * 1000)
    expected = [
        [t, "stale", impressions + 9, clicks + 1]
        if t == stale_ms
        else [t, source, impressions, clicks]
        for t, source, impressions, clicks in dashboard_lake.expected_series()
    ]
    assert page.evaluate(SERIES) == expected
    summary = page.evaluate("document.getElementById('ctr-summary').textContent")
    assert summary == (
        "· minute buckets: 29 exact (batch), 1 stale (late events not yet recomputed), "
        "21 approximate (speed)"
    )

    # Its tooltip and its marks: a triangle and a dotted bar, unlike its exact neighbour's
    # filled circle and solid bar and the speed buckets' hatched bars.
    i = page.evaluate(f"ctrDashboard.state.series.findIndex((s) => s.t === {stale_ms})")
    assert page.evaluate(f"{TOOLTIP}(ctrDashboard.charts.series.ctr, {i})")[1] == (
        "exact, plus 10 late events not yet recomputed"
    )
    assert page.evaluate(f"{TOOLTIP}(ctrDashboard.charts.series.volume, {i})")[-1] == (
        "exact, plus 10 late events not yet recomputed"
    )
    marks = page.evaluate(
        f"""(() => {{
          const last = ctrDashboard.state.series.findLastIndex((s) => s.row?.source === "speed");
          const [stale, exact, speed] = [{i}, {i - 1}, last].map({MARKS});
          return [stale.point, exact.point, exact.fill,
                  stale.fill instanceof CanvasPattern, speed.fill instanceof CanvasPattern,
                  stale.fill !== speed.fill];
        }})()"""
    )
    assert marks == ["triangle", "circle", "#4c78a8", True, True, True]

    # c1's daily rows hold covered and speed minutes: mixed, with the late events summed.
    c1_index = page.evaluate("ctrDashboard.charts.campaign_id.chart.data.labels.indexOf('c1')")
    assert page.evaluate(f"{TOOLTIP}(ctrDashboard.charts.campaign_id.chart, {c1_index})")[-1] == (
        "mixed, plus 10 late events not yet recomputed"
    )

    # The stale notice (the interval, its events, since when: the arrivals' archived_at) and
    # the drift panel, as computed above.
    assert page.evaluate(EXACTNESS) == {
        "stale": "1 interval · 10 late events · stale since 2026-11-22 16:00 UTC",
        "staleIntervals": f"{_interval_text(stale, stale + MINUTE)} (10 events)",
        "drift": "Speed layer drift 3 minutes compared, first covered by the latest 2 batch runs",
        "driftTable": [
            ["", "per event", "minute p50", "minute p99", "speed − batch"],
            ["impressions", "4.00 %", "6.00 %", "9.92 %", "+14"],
            ["clicks", "8.00 %", "–", "–", "-2"],
        ],
    }


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


# The CTR axis over series of buckets: (impressions, ctr, interval's top) each.
AXIS = """(async () => {
  const { ctrAxisMax } = await import(new URL("static/charts.js", document.baseURI));
  const line = (buckets) => ({
    series: buckets.map(([impressions, ctr, high], i) => ({
      t: i * 60000,
      row: { impressions, ctr, ctr_ci_low: 0, ctr_ci_high: high },
    })),
  });
  const steady = Array.from({ length: 50 }, () => [500, 0.02, 0.035]);
  return {
    // One bucket of 2 impressions, both clicked: 100 %, its interval to 100 %.
    outlier: ctrAxisMax([line([...steady, [2, 1, 1]])]),
    // A compared line whose only bucket of weight is at 3 %, and a noisy one beside it.
    compared: ctrAxisMax([line(steady), line([[400, 0.03, 0.05], [1, 1, 1], [3, 0, 0.7]])]),
    // Nothing but a handful of impressions: the axis still fits what there is.
    fewOnly: ctrAxisMax([line([[3, 0.33, 0.8], [2, 0.5, 0.9]])]) ?? null,
    // Everything fits: Chart.js decides.
    fits: ctrAxisMax([line(steady)]) ?? null,
    // A long range whose first buckets hold a few dozen late events each (before the traffic
    // began), at 15 %: under a tenth of the typical bucket, they do not set the axis.
    sparseLate: ctrAxisMax([
      line([
        ...Array.from({ length: 20 }, () => [60, 0.15, 0.25]),
        ...Array.from({ length: 100 }, () => [12000, 0.017, 0.019]),
      ]),
    ]),
    // The 6 h view of a demo two hours old: more than half its minutes came before the
    // traffic began (a few dozen late events each, the odd one at 3 %), so its median bucket is
    // one of those; the axis is still set by the full minutes.
    halfEmpty: ctrAxisMax([
      line([
        ...Array.from({ length: 170 }, (_, i) => [40, i % 17 ? 0 : 0.032, 0.1]),
        ...Array.from({ length: 130 }, () => [12000, 0.018, 0.02]),
      ]),
    ]) ?? null,
  };
})()"""

# The headline's CTR leaves out the buckets still receiving clicks (app.js' settledCtr).
SETTLED = """(async () => {
  const { settledCtr } = await import(new URL("static/app.js", document.baseURI));
  const { filling } = await import(new URL("static/charts.js", document.baseURI));
  const minute = 60000;
  // Ten minutes: the first seven at 2 % (100 impressions each), the last three filling at 0.5 %.
  const series = Array.from({ length: 10 }, (_, i) => ({
    t: i * minute,
    row: { impressions: 100, clicks: i < 7 ? 2 : 0.5 },
  }));
  const from = 7 * minute + 1;  // now less the attribution window: buckets ending after it fill
  return {
    headline: settledCtr(series, minute, from),
    none: settledCtr(series, minute, null),
    all: settledCtr(series, minute, -1),
    sixth: filling(6 * minute, minute, from),
    seventh: filling(7 * minute, minute, from),
  };
})()"""


def test_buckets_of_a_few_impressions_do_not_set_the_ctr_axis(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    page.navigate(f"{dashboard_url}/#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready'")
    assert page.evaluate(AXIS) == {
        "outlier": 0.04,  # twice the top of the buckets of 30 impressions or more
        "compared": 0.06,
        "fewOnly": None,
        "fits": None,
        "sparseLate": 0.035,  # twice 1.7 %, rounded up: the late minutes' 15 % is cut
        "halfEmpty": None,  # the full minutes at 1.8 % set it; the sparse ones' 3.2 % fits
    }


def test_the_headline_leaves_out_the_buckets_still_receiving_clicks(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    page.navigate(f"{dashboard_url}/#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready'")
    found = page.evaluate(SETTLED)
    assert found["headline"]["ctr"] == pytest.approx(0.02)
    assert found["headline"]["left"] == 3
    assert found["headline"]["low"] < 0.02 < found["headline"]["high"]
    assert found["none"] is None  # a view without attribution: nothing is left out
    assert found["all"] is None  # every bucket filling: the full range's CTR, with a note
    assert (found["sixth"], found["seventh"]) == (False, True)


def test_a_link_naming_a_dimension_to_compare_compares_its_top_values(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    page.navigate(f"{dashboard_url}/?compare=campaign_id#token={TOKEN}")
    page.wait_for(
        f"{STATE} === 'ready' && ctrDashboard.state.selection.compare.values.length === 3",
        timeout=30,
    )
    assert sorted(page.evaluate("ctrDashboard.state.selection.compare.values")) == [
        "c1",
        "c2",
        "c3",
    ]
    assert page.evaluate("document.getElementById('compare-hint').textContent") == ""
    assert "compare_value=" in page.evaluate("window.location.search")
