"""The analyst's dashboard in headless Chromium, over the real API and the Delta tables of
:mod:`tests.support.dashboard_lake`: filters change every chart to the filtered numbers, a
comparison draws one series per chosen value, the table's CSV download equals the API's rows, a
shared URL restores the same view, every control is reachable by keyboard, the page fits a phone.

Controls are driven as a user drives them: typing and keys through the DevTools input events,
clicks on the page's own buttons.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.browser import Page, chromium_page
from tests.support.dashboard_lake import NOW, TOKEN, Keep, Lake, ci, everything, where
from tests.support.waiting import wait_until

# The answer on the page is the one for the current selection.
SETTLED = (
    "ctrDashboard.state.shown === ctrDashboard.state.generation"
    " && document.body.dataset.state === 'ready'"
)
SERIES = """ctrDashboard.state.series.filter((s) => s.row)
    .map((s) => [s.t, s.row.source, s.row.impressions, s.row.clicks])"""
# Every chart's data as drawn: points with a value, per dataset.
CHARTS = """(() => {
  const c = ctrDashboard.charts;
  const points = (dataset) => dataset.data.filter((p) => p.y !== null).map((p) => [p.x, p.y]);
  const lines = c.series.ctr.data.datasets;
  return {
    ctr: lines.filter((d) => d.role === "ctr").map((d) => [d.label, points(d)]),
    low: lines.filter((d) => d.role === "ci-low").map(points),
    high: lines.filter((d) => d.role === "ci-high").map(points),
    legend: c.series.ctr.legend.legendItems.map((i) => i.text),
    clicks: points(c.series.volume.data.datasets[0]),
    impressions: points(c.series.volume.data.datasets[1]),
    breakdowns: Object.fromEntries(["campaign_id", "country", "device_type"].map((d) =>
      [d, c[d].chart.data.labels.map((label, i) => [label, c[d].chart.data.datasets[0].data[i]])])),
  };
})()"""
TOTALS = """["total-impressions", "total-clicks", "total-ctr"]
    .map((id) => document.getElementById(id).textContent)"""
TABLE = """[...document.querySelectorAll("#data-table tbody tr")]
    .map((tr) => [...tr.cells].map((td) => td.textContent))"""
TABLE_HEAD = """[...document.querySelectorAll("#data-table thead th")]
    .map((th) => [th.textContent, th.getAttribute("aria-sort")])"""
# What a shared link must bring back: the selection, the controls showing it, the numbers.
VIEW = """(() => {
  const s = ctrDashboard.state;
  const chips = (root) => [...root.querySelectorAll(".chip span")].map((c) => c.textContent);
  return {
    selection: s.selection,
    window: [s.view.end - s.view.start, s.view.granularity],
    pressed: document.querySelector('#range [aria-pressed="true"]')?.dataset.range,
    filterChips: Object.fromEntries(Object.entries(ctrDashboard.filterPickers)
      .map(([d, p]) => [d, chips(p.root)])),
    compare: [document.getElementById("compare-dimension").value,
              chips(document.getElementById("compare-picker"))],
    tableControls: [document.getElementById("table-rows").value,
      [...document.querySelectorAll("#table-group-by input:checked")].map((b) => b.value)],
    series: s.series.filter((b) => b.row).map((b) => [b.t, b.row.impressions, b.row.clicks]),
    compared: s.compared?.map((l) =>
      [l.label, l.series.filter((b) => b.row).map((b) => [b.t, b.row.clicks])]),
    table: s.table.rows,
  };
})()"""


def _int(n: int) -> str:
    return f"{n:,}"


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _percent(text: str) -> float:
    """A percentage as the page shows it ("5.63 %")."""
    return float(text.removesuffix(" %"))


def _open(page: Page, url: str) -> None:
    page.navigate(url)
    page.wait_for(SETTLED)


def _settle(page: Page, condition: str = "true") -> None:
    page.wait_for(f"{SETTLED} && ({condition})")


def _focus(page: Page, selector: str) -> None:
    page.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")


def _click(page: Page, selector: str) -> None:
    page.evaluate(f"document.querySelector({json.dumps(selector)}).click()")


def _choose(page: Page, selector: str, value: str) -> None:
    """Pick ``value`` in a <select>, as a user does: the value changes, a change event fires."""
    page.evaluate(
        f"""(() => {{
          const select = document.querySelector({json.dumps(selector)});
          select.value = {json.dumps(value)};
          select.dispatchEvent(new Event("change", {{ bubbles: true }}));
        }})()"""
    )


def _add_filter(page: Page, dimension: str, value: str) -> None:
    """Type ``value`` into the dimension's filter field and press Enter."""
    _focus(page, f'.picker[data-dimension="{dimension}"] input')
    page.type(value)
    page.press("Enter")


def _suggestions(page: Page, dimension: str) -> list[str]:
    """The values the dimension's field suggests once it has the focus."""
    picker = f"ctrDashboard.filterPickers.{dimension}"
    _focus(page, f'.picker[data-dimension="{dimension}"] input')
    page.wait_for(f"{picker}.loaded && !{picker}.stale && {picker}.list.options.length > 0")
    values: list[str] = page.evaluate(f"[...{picker}.list.options].map((o) => o.value)")
    return values


def _assert_charts_show(page: Page, lake: Lake, keep: Keep) -> None:
    """Every chart, the totals and the table hold the numbers of the kept rows."""
    expected = lake.expected_series(keep)
    assert page.evaluate(SERIES) == expected
    charts = page.evaluate(CHARTS)
    assert charts["ctr"] == [
        [
            "CTR",
            [[t, pytest.approx(clicks / impressions)] for t, _, impressions, clicks in expected],
        ]
    ]
    assert charts["impressions"] == [[t, impressions] for t, _, impressions, _ in expected]
    assert charts["clicks"] == [[t, clicks] for t, _, _, clicks in expected]
    for dimension, bars in charts["breakdowns"].items():
        ctr = lake.expected_ctr(dimension, keep)
        ranking = lake.expected_ranking(dimension, keep)
        assert bars == [[value, pytest.approx(ctr[value])] for value in ranking], dimension
    impressions = sum(row[2] for row in expected)
    clicks = sum(row[3] for row in expected)
    assert page.evaluate(TOTALS) == [_int(impressions), _int(clicks), _pct(clicks / impressions)]
    # The default table: totals per campaign, most clicks first (ties: by name, the API's rule).
    campaigns = lake.totals("campaign_id", keep)
    assert [row[:3] for row in page.evaluate(TABLE)] == [
        [c, _int(campaigns[c][0]), _int(campaigns[c][1])]
        for c in sorted(campaigns, key=lambda c: (-campaigns[c][1], c))
    ]


def test_filters_change_every_chart_to_the_filtered_numbers(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    _open(page, f"{dashboard_url}/#token={TOKEN}")
    _assert_charts_show(page, dashboard_lake, everything)

    # Suggestions come from the data, the most impressions first.
    assert _suggestions(page, "site_id") == ["s1", "s2"]
    page.type("s1")
    page.press("Enter")
    _settle(page, "location.search.includes('site_id=s1')")
    _assert_charts_show(page, dashboard_lake, where(site_id="s1"))
    assert page.evaluate("document.getElementById('totals-scope').textContent").endswith(
        "only site s1"
    )

    # Another dimension's suggestions follow the filters: site s1 has US and DE traffic only.
    assert _suggestions(page, "country") == ["DE", "US"]
    _add_filter(page, "device_type", "mobile")
    _settle(page, "location.search.includes('device_type=mobile')")
    _assert_charts_show(page, dashboard_lake, where(site_id="s1", device_type="mobile"))

    # Two values of one dimension: either of them.
    _add_filter(page, "campaign_id", "c1")
    _add_filter(page, "campaign_id", "c3")
    _settle(page, "ctrDashboard.state.selection.filters.campaign_id?.length === 2")
    _assert_charts_show(
        page, dashboard_lake, where(site_id="s1", device_type="mobile", campaign_id=("c1", "c3"))
    )

    # The site chip removed with the keyboard: its x button focused, Enter.
    _focus(page, '.picker[data-dimension="site_id"] .chip button')
    page.press("Enter")
    _settle(page, "!location.search.includes('site_id')")
    _assert_charts_show(page, dashboard_lake, where(device_type="mobile", campaign_id=("c1", "c3")))

    # A bar of a breakdown chart adds its value as a filter; "clear" brings all traffic back.
    page.evaluate(
        """(() => {
          const chart = ctrDashboard.charts.country.chart;
          const bar = chart.getDatasetMeta(0).data[chart.data.labels.indexOf("FR")];
          chart.options.onClick({}, [{ index: chart.data.labels.indexOf("FR"), element: bar }]);
        })()"""
    )
    _settle(page, "location.search.includes('country=FR')")
    _assert_charts_show(
        page, dashboard_lake, where(device_type="mobile", campaign_id=("c1", "c3"), country="FR")
    )
    _click(page, "#clear-all")
    _settle(page, "location.search === '?range=1h'")
    _assert_charts_show(page, dashboard_lake, everything)


def _compared(page: Page) -> list[tuple[str, list[list[Any]], list[list[Any]], list[list[Any]]]]:
    charts = page.evaluate(CHARTS)
    return [
        (label, points, low, high)
        for (label, points), low, high in zip(
            charts["ctr"], charts["low"], charts["high"], strict=True
        )
    ]


def _expected_line(lake: Lake, keep: Keep) -> tuple[list[Any], list[Any], list[Any]]:
    """CTR points and the interval's bounds per bucket of the kept rows."""
    rows = lake.expected_series(keep)
    bounds = [(t, *ci(impressions, clicks)) for t, _, impressions, clicks in rows]
    return (
        [[t, pytest.approx(c / i)] for t, _, i, c in rows],
        [[t, pytest.approx(low)] for t, low, _ in bounds],
        [[t, pytest.approx(high)] for t, _, high in bounds],
    )


def test_a_comparison_draws_one_series_per_value(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    _open(page, f"{dashboard_url}/#token={TOKEN}")

    # Comparing countries starts with the three with the most impressions.
    _choose(page, "#compare-dimension", "country")
    _settle(page, "ctrDashboard.state.compared?.length === 3")
    lines = _compared(page)
    assert [line[0] for line in lines] == ["FR", "DE", "US"]
    for label, points, low, high in lines:
        assert (points, low, high) == _expected_line(dashboard_lake, where(country=label)), label
    assert page.evaluate(CHARTS)["legend"] == ["FR", "DE", "US"]
    assert "comparing 3 country values" in page.evaluate(
        "document.getElementById('ctr-summary').textContent"
    )
    # The volume chart keeps the whole (filtered) traffic.
    assert page.evaluate(SERIES) == dashboard_lake.expected_series()

    # Under a filter on another dimension, each line is that value's filtered traffic: DE's
    # traffic is all desktop, so its line is empty.
    _add_filter(page, "device_type", "mobile")
    _settle(page, "location.search.includes('device_type=mobile')")
    by_label = {line[0]: line[1:] for line in _compared(page)}
    assert by_label["FR"] == _expected_line(dashboard_lake, where(country="FR"))
    assert by_label["US"] == _expected_line(dashboard_lake, where(country="US"))
    assert by_label["DE"] == ([], [], [])

    # Removing values: two still compare; one is not a comparison, and the page says so.
    _focus(page, "#compare-picker .chip:last-child button")
    page.press("Enter")
    _settle(page, "ctrDashboard.state.compared?.length === 2")
    assert [line[0] for line in _compared(page)] == ["FR", "DE"]
    _focus(page, "#compare-picker .chip:last-child button")
    page.press("Enter")
    _settle(page, "ctrDashboard.state.compared === null")
    assert [line[0] for line in _compared(page)] == ["CTR"]
    assert page.evaluate("document.getElementById('compare-hint').textContent") == (
        "pick 2 to 5 values to compare (1 so far)"
    )

    # Values typed by hand, up to five: the field is disabled at the fifth.
    _focus(page, "#compare-picker input")
    for value in ("DE", "US", "XX", "YY"):
        page.type(value)
        page.press("Enter")
    _settle(page, "ctrDashboard.state.compared?.length === 5")
    assert [line[0] for line in _compared(page)] == ["FR", "DE", "US", "XX", "YY"]
    assert page.evaluate("document.querySelector('#compare-picker input').disabled")


def _table_params(page: Page, **table: str) -> dict[str, str]:
    start, end = page.evaluate(
        "[ctrDashboard.state.view.start, ctrDashboard.state.view.end]"
        ".map((ms) => new Date(ms).toISOString().slice(0, 16) + 'Z')"
    )
    return {"start": start, "end": end, "limit": "1000", "reach": "true", **table}


def _downloaded(directory: Path) -> Path:
    [done, *_] = wait_until(
        lambda: [p for p in directory.glob("*.csv") if p.stat().st_size > 0],
        timeout_s=60,
        what=f"a CSV was downloaded into {directory}",
    )
    return done


def test_the_table_sorts_and_its_csv_download_equals_the_api_rows(
    dashboard_url: str, page: Page, tmp_path: Path
) -> None:
    downloads = tmp_path / "downloads"
    page.allow_downloads(downloads)
    _open(page, f"{dashboard_url}/#token={TOKEN}")
    # No refresh of its own, so the page's time window stays the one the API is asked for.
    _click(page, "#auto-refresh")

    # Per minute, by country instead of campaign, ordered by CTR (the column's header).
    _choose(page, "#table-rows", "bucket")
    _click(page, '#table-group-by input[value="country"]')
    _click(page, '#table-group-by input[value="campaign_id"]')
    _settle(page, "location.search.includes('table_by=country')")
    _click(page, '#data-table thead button[data-sort="ctr"]')
    _settle(page, "location.search.includes('table_sort=-ctr')")
    assert page.evaluate(TABLE_HEAD)[:4] == [
        ["Bucket (UTC)", None],
        ["Country", None],
        ["Impressions", None],
        ["Clicks", None],
    ]
    assert page.evaluate(TABLE_HEAD)[4] == ["CTR ▼", "descending"]
    params = _table_params(page, granularity="minute", group_by="country", order_by="-ctr")
    with httpx.Client(base_url=dashboard_url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        rows = api.get("/api/v1/ctr", params=params).json()["rows"]
        csv_bytes = api.get("/api/v1/ctr", params={**params, "format": "csv"}).content
    assert len(rows) == 3 * 51  # three countries, every minute with data
    table = page.evaluate(TABLE)
    assert [row[:4] for row in table] == [
        [
            r["bucket_start"][:16].replace("T", " "),
            r["country"],
            _int(r["impressions"]),
            _int(r["clicks"]),
        ]
        for r in rows
    ]
    assert [_percent(row[4]) for row in table] == [
        pytest.approx(100 * r["ctr"], abs=0.005001) for r in rows
    ]
    # Clicked again: ascending.
    _click(page, '#data-table thead button[data-sort="ctr"]')
    _settle(page, "location.search.includes('table_sort=ctr')")
    assert page.evaluate(TABLE_HEAD)[4] == ["CTR ▲", "ascending"]
    assert _percent(page.evaluate(TABLE)[0][4]) == pytest.approx(
        100 * min(r["ctr"] for r in rows), abs=0.005001
    )

    # The download: the API's CSV of the table's query, byte for byte, and so its rows.
    _click(page, '#data-table thead button[data-sort="ctr"]')
    _settle(page, "location.search.includes('table_sort=-ctr')")
    _click(page, "#download-csv")
    saved = _downloaded(downloads)
    assert saved.name.startswith("ctr_")
    assert saved.name.endswith("Z.csv")
    assert saved.read_bytes() == csv_bytes
    header, *lines = csv.reader(io.StringIO(saved.read_bytes().decode(), newline=""))
    assert header[:9] == [
        "bucket_start",
        "country",
        "impressions",
        "clicks",
        "raw_clicks",
        "orphan_clicks",
        "repeat_clicks",
        "ctr",
        "ctr_ci_low",
    ]
    # Version 1: raw clicks are the clicks, no orphan or repeat counts (empty cells).
    assert [line[:8] for line in lines] == [
        [
            r["bucket_start"],
            r["country"],
            str(r["impressions"]),
            str(r["clicks"]),
            str(r["clicks"]),
            "",
            "",
            str(r["ctr"]),
        ]
        for r in rows
    ]


def test_a_shared_url_restores_the_same_view(
    dashboard_url: str, page: Page, tmp_path: Path
) -> None:
    _open(page, f"{dashboard_url}/#token={TOKEN}")
    _click(page, '#range [data-range="6h"]')
    _settle(page, "location.search.includes('range=6h')")
    _add_filter(page, "country", "US")
    _add_filter(page, "country", "FR")
    _settle(page, "ctrDashboard.state.selection.filters.country?.length === 2")
    _choose(page, "#compare-dimension", "campaign_id")
    _settle(page, "ctrDashboard.state.compared?.length === 2")
    _choose(page, "#table-rows", "bucket")
    _click(page, '#table-group-by input[value="site_id"]')
    _settle(page, "location.search.includes('table_by=campaign_id%2Csite_id')")
    _click(page, '#data-table thead button[data-sort="impressions"]')
    _settle(page, "location.search.includes('table_sort=-impressions')")
    shown = page.evaluate(VIEW)
    link = page.evaluate("location.href")
    assert "#" not in link  # the token never travels in a shared link
    assert shown["selection"] == {
        "range": "6h",
        "start": None,
        "end": None,
        "filters": {"country": ["US", "FR"]},
        "compare": {"dimension": "campaign_id", "values": ["c3", "c1"]},
        "table": {"rows": "bucket", "groupBy": ["campaign_id", "site_id"], "sort": "-impressions"},
    }
    assert shown["compared"] is not None
    assert len(shown["table"]) == 2 * 51

    # Another browser (its own profile) opens the link, with the token it has: the same view.
    with chromium_page(tmp_path / "second-browser") as other:
        other.start_clock_at(NOW)  # the lake's time, as the first page's
        _open(other, f"{link}#token={TOKEN}")
        assert other.evaluate(VIEW) == shown
        assert other.exceptions == []

    # Back walks through the views the analyst had: before the table's order, and before that.
    page.evaluate("history.back()")
    _settle(page, "!location.search.includes('table_sort')")
    assert page.evaluate(VIEW)["selection"]["table"]["sort"] == "-clicks"
    page.evaluate("history.forward()")
    _settle(page, "location.search.includes('table_sort=-impressions')")
    assert page.evaluate(VIEW) == shown

    # A link with parts the page cannot show opens the rest, and says what it dropped.
    _open(page, f"{dashboard_url}/?range=2y&country=US&compare=city&table_sort=-revenue")
    view = page.evaluate(VIEW)
    assert (view["selection"]["range"], view["selection"]["filters"]) == ("6h", {"country": ["US"]})
    assert page.evaluate("ctrDashboard.state.urlProblems") == [
        "range: unknown range '2y'",
        "compare: unknown dimension 'city'",
        "table_sort: cannot order by '-revenue'",
    ]


# Tab through the page from the top: what gets the focus, named for the assertion.
TAB_NAME = """(() => {
  const el = document.activeElement;
  const picker = el.closest(".picker");
  if (picker) return `${picker.dataset.dimension}:${el.tagName}`;
  return el.dataset.range ?? el.dataset.sort ?? (el.id || el.value || el.tagName);
})()"""


def test_every_control_is_reachable_by_keyboard_and_the_page_fits_a_phone(
    dashboard_url: str, page: Page
) -> None:
    _open(page, f"{dashboard_url}/?country=US#token={TOKEN}")
    page.evaluate("document.activeElement?.blur(); window.scrollTo(0, 0)")
    reached = []
    for _ in range(60):
        page.press("Tab")
        reached.append(page.evaluate(TAB_NAME))
    expected = [
        "15m", "1h", "6h", "24h", "7d", "custom", "auto-refresh", "refresh-now", "copy-link",
        "change-token", "campaign_id:INPUT", "ad_id:INPUT", "site_id:INPUT", "country:INPUT",
        "country:BUTTON", "device_type:INPUT", "compare-dimension", "clear-all", "table-rows",
        "campaign_id", "ad_id", "site_id", "country", "device_type", "download-csv",
    ]  # fmt: skip
    in_order = [name for name in reached if name in expected]
    assert list(dict.fromkeys(in_order)) == expected
    # Table headers that sort are buttons, in the tab order.
    assert {"impressions", "clicks", "ctr"} <= set(reached)

    # A phone: nothing wider than the screen, every chart drawn.
    page.resize(390, 844, mobile=True)
    page.evaluate("new Promise((done) => setTimeout(done, 300))")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    widths = page.evaluate(
        "[...document.querySelectorAll('canvas')].map((c) => c.getBoundingClientRect().right)"
    )
    assert len(widths) == 6
    assert max(widths) <= 390
