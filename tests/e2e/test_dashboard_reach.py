"""Reach and frequency on the dashboard, in headless Chromium over the real API and a lake whose
rows say who they reached (:class:`tests.support.dashboard_lake.ReachLake`: the batch rows' user
lists and sketches, the speed rows' sketches).

The totals' reach is the API's one row for the range (granularity=all), exact and said so where
batch runs cover the range, an estimate with ≈ and its bounds where speed rows are included; the
frequency is impressions per user; the reach line has a point per bucket, hollow where
estimated; the table has both columns; a lake written before reach was measured shows a dash."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from api.settings import ApiSettings
from infra.browser import Page
from tests.support.api_server import running_api
from tests.support.dashboard_lake import (
    MINUTE,
    TOKEN,
    Keep,
    Lake,
    ReachLake,
    UnmeasuredLake,
    everything,
    where,
)

SETTLED = (
    "ctrDashboard.state.shown === ctrDashboard.state.generation"
    " && document.body.dataset.state === 'ready'"
)
# The totals' figures as shown.
TOTALS = """(() => {
  const text = (id) => document.getElementById(id).textContent;
  return {
    impressions: text("total-impressions"),
    reach: text("total-reach"),
    note: text("total-reach-note"),
    frequency: text("total-frequency"),
    summary: text("reach-summary"),
  };
})()"""
# The reach chart: its line and band as data, and the line's points Chart.js laid out inside
# the chart area with their fill (the line's colour where exact, white where estimated).
REACH_CHART = """(() => {
  const chart = ctrDashboard.charts.series.reach;
  const points = (i) => chart.data.datasets[i].data
    .filter((p) => p.y !== null).map((p) => [p.x, p.y]);
  const a = chart.chartArea;
  const drawn = chart.getDatasetMeta(0).data
    .map((el, j) => [chart.data.datasets[0].data[j], el])
    .filter(([p, el]) => p.y !== null && !el.skip && Number.isFinite(el.y)
      && el.x >= a.left - 1 && el.x <= a.right + 1 && el.y >= a.top - 1 && el.y <= a.bottom + 1)
    .map(([p, el]) => [p.x, el.options.backgroundColor]);
  return { line: points(0), low: points(1), high: points(2), drawn,
           legend: chart.legend.legendItems.map((i) => i.text) };
})()"""
ROWS = """ctrDashboard.state.series.filter((s) => s.row).map((s) => s.row)"""
# The table's cells by column header (sort arrows left out).
TABLE = """(() => {
  const heads = [...document.querySelectorAll("#data-table thead th")]
    .map((th) => th.textContent.replace(/ [▲▼]$/, ""));
  return [...document.querySelectorAll("#data-table tbody tr")].map((tr) =>
    Object.fromEntries([...tr.cells].map((td, i) => [heads[i], td.textContent])));
})()"""
PURPLE = "#b279a2"


@pytest.fixture
def dashboard_lake(tmp_path: Path) -> Lake:
    """Overrides conftest's: the lake with reach."""
    return ReachLake.fresh(tmp_path / "lake")


def _fixed2(x: float) -> str:
    """``x`` as JavaScript's ``toFixed(2)`` writes it (the exact value, halves rounded up)."""
    return str(Decimal(x).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%MZ")


def _open(page: Page, url: str) -> None:
    page.navigate(url)
    page.wait_for(SETTLED)
    # No refresh of its own: the page's time window stays the one the test asks the API about.
    page.evaluate("document.getElementById('auto-refresh').click()")


def _window(page: Page) -> dict[str, str]:
    """The range of the answer on the page, as the API's start and end."""
    start, end = page.evaluate(
        "[ctrDashboard.state.view.start, ctrDashboard.state.view.end]"
        ".map((ms) => new Date(ms).toISOString().slice(0, 16) + 'Z')"
    )
    return {"start": start, "end": end}


@pytest.fixture
def api(dashboard_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=dashboard_url, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield client


def _all_row(api: httpx.Client, params: dict[str, Any]) -> dict[str, Any]:
    """The API's one row for the whole range (granularity=all) of ``params``."""
    rows = api.get("/api/v1/ctr", params={**params, "granularity": "all", "reach": "true"}).json()[
        "rows"
    ]
    assert len(rows) == 1
    row: dict[str, Any] = rows[0]
    return row


def _assert_exact_minutes(page: Page, lake: ReachLake, keep: Keep = everything) -> None:
    """The exact buckets' reach is the distinct users of their rows."""
    exact = [r for r in page.evaluate(ROWS) if r["reach_exact"]]
    assert exact
    for row in exact:
        start = dt.datetime.fromisoformat(row["bucket_start"].replace("Z", "+00:00"))
        assert row["reach"] == len(lake.expected_users(start, start + MINUTE, keep))


def test_the_reach_total_is_the_ranges_own_row_and_estimated_with_speed_rows(
    dashboard_url: str, dashboard_lake: Lake, page: Page, api: httpx.Client
) -> None:
    assert isinstance(dashboard_lake, ReachLake)
    _open(page, f"{dashboard_url}/#token={TOKEN}")

    # The last hour holds speed minutes: the range's reach is the sketches' estimate.
    total = _all_row(api, _window(page))
    assert (total["source"], total["reach_exact"]) == ("mixed", False)
    assert total["reach_low"] <= total["reach"] <= total["reach_high"]
    shown = page.evaluate(TOTALS)
    assert shown["impressions"] == f"{total['impressions']:,}"
    assert shown["reach"] == f"≈{total['reach']:,}"
    assert shown["note"] == f"{total['reach_low']:,}–{total['reach_high']:,}"
    assert shown["frequency"] == _fixed2(total["frequency"])
    # The API's frequency is impressions per reach as reported (rounded to two decimals here).
    assert float(shown["frequency"]) == pytest.approx(
        total["impressions"] / total["reach"], abs=0.005001
    )
    assert shown["summary"] == (
        "· minute buckets: 30 exact, 21 estimated · users do not add up across buckets"
    )

    # The reach line: one point per bucket with data, the rows' reach, the bounds as a band;
    # filled where the batch layer counted the users, hollow where a sketch estimated them.
    rows = page.evaluate(ROWS)
    assert len(rows) == len(dashboard_lake.expected_series()) == 51
    chart = page.evaluate(REACH_CHART)
    stamp = [int(dt.datetime.fromisoformat(r["bucket_start"]).timestamp() * 1000) for r in rows]
    assert chart["line"] == [[t, r["reach"]] for t, r in zip(stamp, rows, strict=True)]
    assert chart["low"] == [[t, r["reach_low"]] for t, r in zip(stamp, rows, strict=True)]
    assert chart["high"] == [[t, r["reach_high"]] for t, r in zip(stamp, rows, strict=True)]
    assert chart["drawn"] == [
        [t, PURPLE if r["reach_exact"] else "#fff"] for t, r in zip(stamp, rows, strict=True)
    ]
    assert [r["reach_exact"] for r in rows] == [r["source"] == "batch" for r in rows]
    assert any(r["reach_low"] < r["reach_high"] for r in rows if not r["reach_exact"])
    assert chart["legend"] == ["reach (distinct users)", "bounds of the estimates"]
    _assert_exact_minutes(page, dashboard_lake)
    # Users come back minute after minute: the buckets' reach sums to far more than the range's.
    assert sum(r["reach"] for r in rows) > 3 * total["reach"]

    # The table (totals per campaign, mixed rows): each row's own estimate and frequency.
    answer = page.evaluate("ctrDashboard.state.table.rows")
    table = page.evaluate(TABLE)
    assert [(c["Campaign"], c["Reach"], c["Frequency"]) for c in table] == [
        (r["campaign_id"], f"≈{r['reach']:,}", _fixed2(r["frequency"])) for r in answer
    ]


def test_a_range_the_batch_layer_covers_has_exact_reach(
    dashboard_url: str, dashboard_lake: Lake, page: Page, api: httpx.Client
) -> None:
    assert isinstance(dashboard_lake, ReachLake)
    start, end = dashboard_lake.batch_minutes[0], dashboard_lake.covered_end
    custom = f"range=custom&start={_iso(start)}&end={_iso(end)}"
    for query, keep in (("", everything), ("&country=US&country=FR", where(country=("US", "FR")))):
        _open(page, f"{dashboard_url}/?{custom}{query}&table_rows=bucket#token={TOKEN}")
        params: dict[str, Any] = {"start": _iso(start), "end": _iso(end)}
        if query:
            params["country"] = ["US", "FR"]
        total = _all_row(api, params)
        users = len(dashboard_lake.expected_users(start, end, keep))
        assert (total["source"], total["reach_exact"], total["reach"]) == ("batch", True, users)
        assert total["reach_low"] == total["reach_high"] == users
        shown = page.evaluate(TOTALS)
        assert shown["impressions"] == f"{total['impressions']:,}"
        assert (shown["reach"], shown["note"]) == (f"{users:,}", "exact")
        assert shown["frequency"] == _fixed2(total["impressions"] / users), query
        assert shown["summary"] == (
            "· minute buckets: 30 exact · users do not add up across buckets"
        )
        chart = page.evaluate(REACH_CHART)
        assert len(chart["line"]) == 30
        assert {fill for _, fill in chart["drawn"]} == {PURPLE}
        assert chart["low"] == chart["high"] == chart["line"]  # no band: nothing estimated
        _assert_exact_minutes(page, dashboard_lake, keep)
        # The table per minute and campaign: exact counts, no ≈.
        answer = page.evaluate("ctrDashboard.state.table.rows")
        assert len(answer) == 30 * (2 if query else 3)
        assert [(c["Reach"], c["Frequency"]) for c in page.evaluate(TABLE)] == [
            (f"{r['reach']:,}", _fixed2(r["impressions"] / r["reach"])) for r in answer
        ]


@pytest.mark.parametrize("kind", [UnmeasuredLake, Lake], ids=["no-reach-columns", "null-reach"])
def test_reach_not_measured_shows_a_dash(kind: type[Lake], page: Page, tmp_path: Path) -> None:
    lake = kind.fresh(tmp_path / "old-lake")
    with running_api(ApiSettings(token=SecretStr(TOKEN)), lake.settings) as url:
        _open(page, f"{url}/#token={TOKEN}")
        shown = page.evaluate(TOTALS)
        chart = page.evaluate(REACH_CHART)
        table = page.evaluate(TABLE)
        rows = page.evaluate(ROWS)
        failures = page.evaluate("ctrDashboard.state.failures")
    assert len(rows) == 51
    assert all(r["reach"] is None and r["frequency"] is None for r in rows)
    assert shown == {
        "impressions": f"{sum(r[2] for r in lake.expected_series()):,}",
        "reach": "–",
        "note": "not measured",
        "frequency": "–",
        "summary": "· minute buckets: 51 not measured · users do not add up across buckets",
    }
    assert (chart["line"], chart["low"], chart["high"], chart["drawn"]) == ([], [], [], [])
    assert table
    assert {(c["Reach"], c["Frequency"]) for c in table} == {("–", "–")}
    assert failures == []
    assert [m for m in page.console if m.startswith(("error", "warning", "assert"))] == []


def test_reach_refused_for_a_heavy_range_is_dropped_and_the_counts_stay(
    dashboard_lake: Lake, page: Page
) -> None:
    """An API whose reach limit the range is over (API_CTR_REACH_MAX_VALUES, set low here as a
    heavy day would be at its default) refuses the reach queries with a 400: the page asks the
    same queries without reach, shows the counts, and says why reach is not shown."""
    assert isinstance(dashboard_lake, ReachLake)
    settings = ApiSettings(token=SecretStr(TOKEN), ctr_reach_max_values=1)
    with running_api(settings, dashboard_lake.settings) as url:
        refused = httpx.get(
            f"{url}/api/v1/ctr",
            params={"start": _iso(dashboard_lake.batch_minutes[0]), "reach": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        _open(page, f"{url}/#token={TOKEN}")
        shown = page.evaluate(TOTALS)
        rows = page.evaluate(ROWS)
        failures = page.evaluate("ctrDashboard.state.failures")
        alerts_shown = page.evaluate("document.getElementById('alerts-summary').textContent")
    assert refused.status_code == 400
    assert "API_CTR_REACH_MAX_VALUES" in refused.json()["detail"]
    assert len(rows) == 51
    assert all("reach" not in r for r in rows)  # answered without reach
    assert shown["impressions"] == f"{sum(r[2] for r in dashboard_lake.expected_series()):,}"
    assert (shown["reach"], shown["frequency"]) == ("–", "–")
    assert shown["summary"].startswith("· reach not shown for this range: api/v1/ctr answered 400")
    assert "API_CTR_REACH_MAX_VALUES" in shown["summary"]
    assert alerts_shown.startswith("· ")  # the alerts panel was rendered
    assert failures == []
