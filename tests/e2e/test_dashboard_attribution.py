"""The dashboard in headless Chromium over a lake that publishes version 3 of ``ctr`` (clicks
attributed to their impressions): the totals show raw, orphan and repeat clicks, orphan clicks
as a share of the raw clicks, and the table has their columns; a version-1 lake shows none of
them (``test_dashboard.py``'s lake)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.browser import Page
from tests.support.dashboard_lake import TOKEN, AttributedLake, Lake

STATE = "document.body.dataset.state"
ATTRIBUTION = """(() => {
  const el = (id) => document.getElementById(id);
  const text = (id) => el(id).textContent.replace(/\\s+/g, " ").trim();
  return {
    shown: el("attribution").getClientRects().length > 0,
    raw: text("total-raw-clicks"),
    orphans: el("orphan-clicks").innerText.replace(/\\s+/g, " ").trim(),
    repeats: text("total-repeat-clicks"),
    clicks: text("total-clicks"),
    headers: [...document.querySelectorAll("#data-table thead th")].map((th) => th.textContent),
  };
})()"""


@pytest.fixture
def dashboard_lake(tmp_path: Path) -> Lake:
    """Overrides conftest's: the version-3 lake."""
    return AttributedLake.fresh(tmp_path / "lake")


def _open(page: Page, url: str) -> None:
    page.navigate(f"{url}/#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready'")


def test_the_totals_show_orphan_clicks_as_data_quality(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    assert isinstance(dashboard_lake, AttributedLake)
    _open(page, dashboard_url)
    clicks, raw, orphans, repeats = dashboard_lake.attribution_totals()
    shown = page.evaluate(ATTRIBUTION)
    assert shown["shown"] is True
    assert shown["clicks"] == f"{clicks:,}"
    assert shown["raw"] == f"{raw:,}"
    assert (
        shown["orphans"] == f"Orphan clicks {orphans:,} {100 * orphans / raw:.2f} % of raw clicks"
    )
    assert shown["repeats"] == f"{repeats:,}"
    # The table of the default view (totals per campaign) has the counts' columns.
    assert shown["headers"][:6] == [
        "Campaign",
        "Impressions",
        "Clicks ▼",
        "Raw clicks",
        "Orphan clicks",
        "Repeat clicks",
    ]
    table = page.evaluate(
        "[...document.querySelectorAll('#data-table tbody tr')]"
        ".map((tr) => [...tr.cells].slice(0, 6).map((c) => c.textContent))"
    )
    answer = page.evaluate("ctrDashboard.state.table")  # the API's answer the table shows
    assert answer["query"]["order_by"] == ["-clicks"]
    assert table == [
        [
            r["campaign_id"],
            *(
                f"{r[c]:,}"
                for c in ("impressions", "clicks", "raw_clicks", "orphan_clicks", "repeat_clicks")
            ),
        ]
        for r in answer["rows"]
    ]
    # Sorting by a new column asks the API to order by it.
    page.evaluate("document.querySelector('#data-table button[data-sort=orphan_clicks]').click()")
    page.wait_for(f"{STATE} === 'ready' && location.search.includes('table_sort=-orphan_clicks')")


def test_a_version_without_attribution_hides_the_figure(
    page: Page, tmp_path: Path, dashboard_url: str
) -> None:
    # conftest's lake is overridden in this module: a version-1 lake of its own.
    from pydantic import SecretStr

    from api.settings import ApiSettings
    from tests.support.api_server import running_api

    lake = Lake.fresh(tmp_path / "v1-lake")
    with running_api(ApiSettings(token=SecretStr(TOKEN)), lake.settings) as url:
        _open(page, url)
        shown = page.evaluate(ATTRIBUTION)
    assert shown["shown"] is False
    assert "Raw clicks" not in shown["headers"]
