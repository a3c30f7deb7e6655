"""The dashboard with an advertiser's key, in headless Chromium over the real API: every chart,
total, breakdown, table row and suggestion holds its campaigns' rows only, and nothing on the
page hints at the others."""

from __future__ import annotations

import re

from access.key_store import create_key
from infra.browser import Page
from tests.e2e.test_dashboard_analyst import _assert_charts_show, _open, _suggestions
from tests.support.dashboard_lake import Lake, where


def test_an_advertiser_sees_its_campaigns_only(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    _, key = create_key(dashboard_lake.settings, "acme", "advertiser", campaigns=("c1", "c3"))
    _open(page, f"{dashboard_url}/#token={key}")
    mine = where(campaign_id=("c1", "c3"))
    _assert_charts_show(page, dashboard_lake, mine)
    # Suggestions come from its rows: c2 (site s1, DE, desktop, a2) is nowhere.
    assert _suggestions(page, "campaign_id") == ["c3", "c1"]
    assert _suggestions(page, "country") == ["FR", "US"]
    assert _suggestions(page, "device_type") == ["mobile"]
    # Who is signed in, and no drift panel (drift is counted over every campaign).
    assert page.evaluate("document.getElementById('key-identity').textContent") == (
        "key acme · advertiser: c1, c3"
    )
    assert page.evaluate("document.getElementById('drift').hidden") is True
    text = page.evaluate("document.body.innerText")
    for other in ("c2", "a2", "DE", "desktop"):
        assert not re.search(rf"\b{other}\b", text), other

    # The same page with an analyst's key: every campaign, and the drift panel.
    _, analyst = create_key(dashboard_lake.settings, "ana", "analyst")
    page.navigate("about:blank")
    _open(page, f"{dashboard_url}/#token={analyst}")
    _assert_charts_show(page, dashboard_lake, lambda _: True)
    assert page.evaluate("document.getElementById('drift').hidden") is False
    assert page.evaluate("document.getElementById('key-identity').textContent") == (
        "key ana · analyst"
    )
