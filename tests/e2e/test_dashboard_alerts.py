"""The dashboard's alerts in headless Chromium over the real API: a lake whose alerts/events
holds a fired alert (open, fired on the speed layer's counts and since confirmed) and an older
one that resolved; the panel lists them newest first with their change, p-value and evidence,
and the CTR chart marks each at its window's end, red while open, grey once over."""

from __future__ import annotations

import datetime as dt
from typing import Any

from access.key_store import create_key
from alerts import store
from alerts.rules import Rule
from alerts.settings import AlertSettings
from infra.browser import Page
from tests.support.dashboard_lake import MINUTE, NOW, TOKEN, Lake

STATE = "document.body.dataset.state"
PANEL = """(() => ({
  summary: document.getElementById("alerts-summary").textContent,
  empty: !document.getElementById("alerts-empty").hidden,
  rows: [...document.querySelectorAll("#alerts-table tbody tr")]
    .map((tr) => [...tr.cells].map((c) => c.textContent)),
  open: [...document.querySelectorAll("#alerts-table tbody tr.open")].map((tr) => tr.dataset.rule),
}))()"""
# The markers the CTR chart drew, and the colour of the canvas under each one's triangle.
MARKERS = """(() => {
  const chart = ctrDashboard.charts.series.ctr;
  const g = chart.canvas.getContext("2d");
  const r = window.devicePixelRatio;
  const area = chart.chartArea;
  return ctrDashboard.charts.series.alertsDrawn.map((m) => ({
    t: m.t, open: m.open, label: m.label,
    at: Math.abs(m.x - chart.scales.x.getPixelForValue(m.t)) < 0.5,
    inside: m.x >= area.left && m.x <= area.right,
    pixel: [...g.getImageData(Math.round(m.x * r), Math.round(m.y * r), 1, 1).data],
  }));
})()"""


def _row(rule: Rule, event: str, end: dt.datetime, **fields: Any) -> dict[str, object]:
    """An alerts/events row as the evaluator writes it (alerts.runner)."""
    return {
        "rule": rule.name,
        "owner": "ctr",  # made on the command line
        "event": event,
        "window_start": end - rule.window_minutes * MINUTE,
        "window_end": end,
        "group_value": fields.pop("group", None),
        "campaign_id": rule.where[1] if rule.where else None,
        "measure": rule.measure,
        "significant": event != "resolved",
        "trials": 15_000,
        "reason": "",
        "delivery": "no webhook",
        **fields,
    }


def _write_alerts(lake: Lake) -> None:
    ads = Rule.create(
        name="c1-ads", measure="ctr", where=("campaign_id", "c1"), per="ad_id", direction="drop"
    )
    volume = Rule.create(name="all-volume", measure="impressions", baseline="previous")
    for rule in (ads, volume):
        store.create_rule(lake.settings, rule, AlertSettings(), now=NOW - 2 * dt.timedelta(hours=1))
    old, fired = NOW - 45 * MINUTE, NOW - 10 * MINUTE
    numbers = {"current": 0.0136, "baseline": 0.02, "change": -0.32, "p_value": 0.0004}
    rows = [
        _row(volume, "fired", old, evidence="exact", current=520.0, baseline=400.0,
             change=0.3, p_value=0.0021, at=old),
        _row(volume, "resolved", old + 5 * MINUTE, evidence="exact", current=410.0,
             baseline=400.0, change=0.025, p_value=0.41, at=old + 5 * MINUTE),
        _row(ads, "fired", fired, group="a1", evidence="approximate", at=fired, **numbers),
        # The batch layer covered the window since: the exact counts say the same.
        _row(ads, "confirmed", fired, group="a1", evidence="exact", at=NOW - 5 * MINUTE,
             **numbers),
    ]  # fmt: skip
    store.append_events(lake.settings, rows, app_id="dashboard-test", version=1)


def _ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


def _red(pixel: list[int]) -> bool:
    red, green, _, alpha = pixel
    return alpha > 200 and red > 180 and green < 100


def _grey(pixel: list[int]) -> bool:
    red, _, blue, alpha = pixel
    return alpha > 200 and red > 120 and abs(red - blue) < 40


def test_the_panel_lists_the_alerts_and_the_chart_marks_them(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    _write_alerts(dashboard_lake)
    page.navigate(f"{dashboard_url}/#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready' && ctrDashboard.state.alerts !== null")
    panel = page.evaluate(PANEL)
    assert panel["empty"] is False
    assert panel["summary"] == "· 1 open"
    assert panel["rows"] == [
        ["2026-11-27 09:05–09:20 UTC", "c1-ads", "a1", "confirmed (exact counts)", "\u221232 %",
         "< 0.001", "exact"],
        ["2026-11-27 09:05–09:20 UTC", "c1-ads", "a1", "fired · open", "\u221232 %", "< 0.001",
         "approximate, then confirmed"],
        ["2026-11-27 08:35–08:50 UTC", "all-volume", "all", "resolved", "+3 %", "0.41", "exact"],
        ["2026-11-27 08:30–08:45 UTC", "all-volume", "all", "fired", "+30 %", "0.0021", "exact"],
    ]  # fmt: skip
    assert panel["open"] == ["c1-ads"]

    markers = page.evaluate(MARKERS)
    assert [(m["t"], m["open"], m["label"]) for m in markers] == [
        (_ms(NOW - 45 * MINUTE), False, "all-volume +30 %"),
        (_ms(NOW - 10 * MINUTE), True, "c1-ads [a1] \u221232 %"),
    ]
    for marker in markers:
        assert marker["at"], marker
        assert marker["inside"], marker
    # Painted: the open one's triangle red, the past one's grey.
    past, now_open = (m["pixel"] for m in markers)
    assert _red(now_open), now_open
    assert _grey(past), past

    # A campaign filter leaves out the markers of the other campaigns' rules (c1's stays; the
    # rule over every row is marked whatever the filter).
    page.navigate(f"{dashboard_url}/?range=1h&campaign_id=c2#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready' && ctrDashboard.state.alerts !== null")
    shown = page.evaluate("ctrDashboard.charts.series.alertsDrawn.map((m) => m.label)")
    assert shown == ["all-volume +30 %"]

    # An advertiser of c2 sees neither c1's alert nor the rule over every row.
    _, key = create_key(
        dashboard_lake.settings, "globex", "advertiser", campaigns=("c2",), allow_unknown=True
    )
    page.navigate("about:blank")
    page.navigate(f"{dashboard_url}/#token={key}")
    page.wait_for(f"{STATE} === 'ready' && ctrDashboard.state.alerts !== null")
    panel = page.evaluate(PANEL)
    assert panel["empty"] is True
    assert panel["rows"] == []
    assert panel["summary"] == "· none open"
    assert page.evaluate("ctrDashboard.charts.series.alertsDrawn.length") == 0


def test_alerts_in_one_minute_get_a_label_line_each(
    dashboard_url: str, dashboard_lake: Lake, page: Page
) -> None:
    """Three ads of one rule firing in the same minute: three labels, one under the other (they
    were drawn over each other)."""
    rule = Rule.create(
        name="c3-ads", measure="ctr", where=("campaign_id", "c3"), per="ad_id", direction="drop"
    )
    store.create_rule(
        dashboard_lake.settings, rule, AlertSettings(), now=NOW - dt.timedelta(hours=2)
    )
    fired = NOW - 30 * MINUTE
    numbers = {"current": 0.01, "baseline": 0.02, "change": -0.5, "p_value": 0.0001}
    rows = [
        _row(rule, "fired", fired, group=ad, evidence="approximate", at=fired, **numbers)
        for ad in ("a7", "a8", "a9")
    ]
    store.append_events(dashboard_lake.settings, rows, app_id="dashboard-test-lines", version=1)
    page.navigate(f"{dashboard_url}/#token={TOKEN}")
    page.wait_for(f"{STATE} === 'ready' && ctrDashboard.state.alerts !== null")
    drawn = page.evaluate(
        "ctrDashboard.charts.series.alertsDrawn.map((m) => ({label: m.label, line: m.line}))"
    )
    lines = [m["line"] for m in drawn if m["label"].startswith("c3-ads")]
    assert len(lines) == 3, drawn
    assert None not in lines, drawn
    assert len(set(lines)) == 3, drawn
