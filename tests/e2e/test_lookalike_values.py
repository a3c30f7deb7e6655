"""Look-alike dimension values on the dashboard, in headless Chromium over the real API.

The event contract refuses invisible and reordering characters (tests/unit/test_validation.py), but
a lake written before it, or a value made in SQL, may hold them: the page shows every such
character as its code point (``cmp-⟨U+202E⟩gnp.exe``, ``cmp-001⟨U+200B⟩``) in the table, the
filter chips and suggestions, the charts' labels and legends and the totals' scope, while the
values it sends to the API stay the data's own, so filtering on one returns its row.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from pydantic import SecretStr

from api.settings import ApiSettings
from events.model import _INVISIBLE
from infra.browser import Page
from lake.settings import LakeSettings
from tests.support import lake_writer
from tests.support.api_server import running_api
from tests.support.dashboard_lake import NOW

TOKEN: Final = "lookalike-test-token"
RLO: Final = "cmp-\u202egnp.exe"  # displays as cmp-exe.png
ZWSP: Final = "cmp-001\u200b"  # displays as cmp-001
PLAIN: Final = "cmp-001"
NBSP: Final = "cmp-002\xa0"  # a trailing space that trimming typed text would cut
SHOWN: Final = {
    RLO: "cmp-⟨U+202E⟩gnp.exe",
    ZWSP: "cmp-001⟨U+200B⟩",
    PLAIN: PLAIN,
    NBSP: "cmp-002⟨U+00A0⟩",
}
# Impressions and clicks per minute of each campaign; five minutes of each.
PER_MINUTE: Final = {RLO: (100, 7), ZWSP: (50, 9), PLAIN: (200, 5), NBSP: (20, 1)}
MINUTES: Final = 5
# Most clicks first, as the table and the breakdown rank them.
RANKED: Final = [ZWSP, RLO, PLAIN, NBSP]

SETTLED = (
    "ctrDashboard.state.shown === ctrDashboard.state.generation"
    " && document.body.dataset.state === 'ready'"
)
TABLE = """[...document.querySelectorAll("#data-table tbody tr")]
    .map((tr) => [...tr.cells].slice(0, 3).map((td) => td.textContent))"""
CAMPAIGN_CHIPS = """[...document.querySelectorAll(
    '.picker[data-dimension="campaign_id"] .chip span')].map((chip) => chip.textContent)"""
CAMPAIGN_BARS = "ctrDashboard.charts.campaign_id.chart.data.labels"


@pytest.fixture
def lookalike_url(tmp_path: Path) -> Iterator[str]:
    """The API over a lake of the campaigns of PER_MINUTE, in the few minutes before the
    dashboard lake's NOW (where the ``page`` fixture's clock starts)."""
    root = tmp_path / "lake"
    lake = LakeSettings(lake_root=root, checkpoint_root=root / "checkpoints")
    now = NOW.replace(second=0, microsecond=0)
    rows = [
        lake_writer.ctr_row(now - dt.timedelta(minutes=m), *PER_MINUTE[c], campaign=c)
        for m in range(1, MINUTES + 1)
        for c in PER_MINUTE
    ]
    lake_writer.write_speed(lake, rows)
    lake_writer.write_status(lake, updated_at=now.isoformat(), watermark=now.isoformat())
    with running_api(ApiSettings(token=SecretStr(TOKEN)), lake) as url:
        yield url


def _row(campaign: str) -> list[str]:
    impressions, clicks = PER_MINUTE[campaign]
    return [SHOWN[campaign], f"{MINUTES * impressions:,}", f"{MINUTES * clicks:,}"]


def _settle(page: Page, condition: str = "true") -> None:
    page.wait_for(f"{SETTLED} && ({condition})")


def _pick(page: Page, value: str) -> None:
    """Pick ``value`` from the campaign field's suggestions (the field has the focus)."""
    page.evaluate(
        f"""(() => {{
          const input = ctrDashboard.filterPickers.campaign_id.input;
          input.value = {json.dumps(value)};
          input.dispatchEvent(new Event("input"));  // not typed: picked from the list
        }})()"""
    )


def _filters(page: Page) -> Any:
    return page.evaluate("ctrDashboard.state.selection.filters.campaign_id ?? []")


def test_look_alike_values_are_shown_escaped_and_filter_on_the_value_itself(
    lookalike_url: str, page: Page
) -> None:
    page.navigate(f"{lookalike_url}/#token={TOKEN}")
    _settle(page)
    # The table and the campaign bars: three different values, three different texts.
    assert page.evaluate(TABLE) == [_row(c) for c in RANKED]
    assert page.evaluate(CAMPAIGN_BARS) == [SHOWN[c] for c in RANKED]

    # Suggestions: picking one adds the value itself; the list's label shows what it holds.
    page.evaluate(
        """document.querySelector('.picker[data-dimension="campaign_id"] input').focus()"""
    )
    picker = "ctrDashboard.filterPickers.campaign_id"
    page.wait_for(f"{picker}.loaded && {picker}.list.options.length === 4")
    options = page.evaluate(f"[...{picker}.list.options].map((o) => [o.value, o.label])")
    assert options == [
        [PLAIN, "1,000 impressions"],
        [RLO, f"{SHOWN[RLO]} · 500 impressions"],
        [ZWSP, f"{SHOWN[ZWSP]} · 250 impressions"],
        [NBSP, f"{SHOWN[NBSP]} · 100 impressions"],
    ]
    _pick(page, ZWSP)
    _settle(page, "ctrDashboard.state.selection.filters.campaign_id?.length === 1")
    assert _filters(page) == [ZWSP]
    assert "campaign_id=cmp-001%E2%80%8B" in page.evaluate("location.search")
    assert page.evaluate(CAMPAIGN_CHIPS) == [SHOWN[ZWSP]]
    assert page.evaluate(TABLE) == [_row(ZWSP)]
    scope = page.evaluate("document.getElementById('totals-scope').textContent")
    assert scope.endswith(f"only campaign {SHOWN[ZWSP]}")

    # The shown text of a value, typed (or pasted) into the field, filters on that value.
    page.type(SHOWN[RLO])
    page.press("Enter")
    _settle(page, "ctrDashboard.state.selection.filters.campaign_id?.length === 2")
    assert _filters(page) == [ZWSP, RLO]
    assert page.evaluate(CAMPAIGN_CHIPS) == [SHOWN[ZWSP], SHOWN[RLO]]
    assert page.evaluate(TABLE) == [_row(ZWSP), _row(RLO)]

    # A suggestion with a space of its own at the end keeps it.
    _pick(page, NBSP)
    _settle(page, "ctrDashboard.state.selection.filters.campaign_id?.length === 3")
    assert _filters(page) == [ZWSP, RLO, NBSP]
    assert page.evaluate(TABLE) == [_row(ZWSP), _row(RLO), _row(NBSP)]

    # A bar of the breakdown chart filters on its value: the plain one, not its look-alike.
    page.evaluate("document.getElementById('clear-all').click()")
    _settle(page, "!ctrDashboard.state.selection.filters.campaign_id")
    page.evaluate(
        f"""(() => {{
          const chart = {CAMPAIGN_BARS.removesuffix(".data.labels")};
          const index = chart.data.labels.indexOf({json.dumps(PLAIN)});
          chart.options.onClick({{}}, [{{ index, element: chart.getDatasetMeta(0).data[index] }}]);
        }})()"""
    )
    _settle(page, "ctrDashboard.state.selection.filters.campaign_id?.length === 1")
    assert _filters(page) == [PLAIN]
    assert page.evaluate(TABLE) == [_row(PLAIN)]

    # Comparing campaigns: one line per value, each legend entry in its shown form.
    page.evaluate("document.getElementById('clear-all').click()")
    _settle(page, "!ctrDashboard.state.selection.filters.campaign_id")
    page.evaluate(
        """(() => {
          const select = document.getElementById("compare-dimension");
          select.value = "campaign_id";
          select.dispatchEvent(new Event("change"));
        })()"""
    )
    # The three with the most impressions.
    _settle(page, "ctrDashboard.state.compared?.length === 3")
    compared = page.evaluate("ctrDashboard.state.compared.map((line) => line.label)")
    assert compared == [PLAIN, RLO, ZWSP]  # the values themselves
    legend = page.evaluate("ctrDashboard.charts.series.ctr.legend.legendItems.map((i) => i.text)")
    assert legend == [SHOWN[PLAIN], SHOWN[RLO], SHOWN[ZWSP]]
    chips = page.evaluate(
        "[...document.querySelectorAll('#compare-picker .chip span')].map((c) => c.textContent)"
    )
    assert chips == [SHOWN[PLAIN], SHOWN[RLO], SHOWN[ZWSP]]


def test_the_page_escapes_what_the_contract_refuses(lookalike_url: str, page: Page) -> None:
    """visibleText against events.model's set, code point by code point, and its inverse."""
    page.navigate(f"{lookalike_url}/#token={TOKEN}")
    _settle(page)
    escaped = page.evaluate(
        """import("./static/visible.js").then(({ visibleText }) => {
          const out = [];
          for (let code = 0; code <= 0x10ffff; code += 1) {
            const char = String.fromCodePoint(code);
            if (visibleText(char) !== char) out.push(code);
          }
          return out;
        })"""
    )
    refused = [ord(char) for char in _INVISIBLE.findall("".join(map(chr, range(0x110000))))]
    # "⟨" too: each shown text stands for one value.
    assert escaped == sorted([*refused, ord("⟨")])

    samples = [RLO, ZWSP, PLAIN, "⟨U+0041⟩", "a⟨b", "tab\there", "\U000e0041x", "😀\ufe0f"]
    shown_and_back = page.evaluate(
        f"""import("./static/visible.js").then(({{ visibleText, valueOfText }}) =>
          {json.dumps(samples)}.map((v) => [visibleText(v), valueOfText(visibleText(v))])
        )"""
    )
    assert [back for _, back in shown_and_back] == samples
    assert [shown for shown, _ in shown_and_back] == [
        SHOWN[RLO],
        SHOWN[ZWSP],
        PLAIN,
        "⟨U+27E8⟩U+0041⟩",
        "a⟨U+27E8⟩b",
        "tab⟨U+0009⟩here",
        "⟨U+E0041⟩x",
        "😀⟨U+FE0F⟩",
    ]
