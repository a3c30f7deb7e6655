"""What ``ctr`` prints of others' text is text (issue 66, finding 5): a webhook URL or a watched
id an advertiser typed, an id from the lake. Printed as Rich markup, ``[/bold]`` crashed
``ctr alerts list`` and ``[link=…]`` showed one URL and linked another; printed raw, escape
sequences set the operator's window title. Real commands in subprocesses, over a real lake."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

from alerts import store
from alerts.rules import Rule
from alerts.settings import AlertSettings
from cli.console import SafeConsole, printable
from lake.settings import LakeSettings
from tests.support.lake_writer import ctr_row, write_speed

CTR = str(Path(sys.executable).with_name("ctr"))
TITLE = "\x1b]0;pwned\x07"  # sets a terminal's window title
RED = "\x1b[31m"
LINK = "[link=https://evil.example]https://good.example[/link]"


def _run(lake: LakeSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LAKE_ROOT": str(lake.lake_root), "COLUMNS": "400"}
    return subprocess.run(
        [CTR, *args], env=env, capture_output=True, text=True, check=False, timeout=120
    )


def test_rules_a_tenant_wrote_are_listed_as_text(lake: LakeSettings) -> None:
    for name, where, url in (
        ("closing", "cmp-[/bold]", "https://hooks.example/[/bold]"),
        ("linked", "cmp-1", f"https://hooks.example/{LINK}"),
        ("titled", f"cmp-{TITLE}{RED}", "https://hooks.example/x"),
    ):
        rule = Rule.create(name=name, measure="ctr", where=("campaign_id", where), webhook_url=url)
        store.create_rule(lake, rule, AlertSettings())
    listed = _run(lake, "alerts", "list")
    assert listed.returncode == 0, listed.stderr
    shown = listed.stderr
    assert "campaign_id=cmp-[/bold]" in shown
    assert "https://hooks.example/[/bold]" in shown
    assert LINK in shown  # the brackets as typed: no hidden link
    assert "\x1b" not in shown
    assert "\x07" not in shown
    assert "cmp-\\x1b]0;pwned\\x07\\x1b[31m" in shown
    tested = _run(lake, "alerts", "test", "titled")
    assert tested.returncode == 0, tested.stderr
    assert "\x1b" not in tested.stderr
    assert "\\x1b]0;pwned" in tested.stderr


def test_an_error_that_quotes_a_value_prints_it_as_text(lake: LakeSettings) -> None:
    failed = _run(lake, "alerts", "delete", f"[/bold]{TITLE}")
    assert failed.returncode == 1
    assert "no rule is named '[/bold]\\x1b]0;pwned\\x07'" in failed.stderr
    assert "\x1b" not in failed.stderr


def test_sql_shows_the_lakes_values_as_text(lake: LakeSettings) -> None:
    at = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
    write_speed(lake, [ctr_row(at, 10, 1, site="site-[/bold]"), ctr_row(at, 5, 0, site=LINK)])
    answered = _run(lake, "sql", "SELECT site_id FROM ctr ORDER BY site_id")
    assert answered.returncode == 0, answered.stderr
    assert "site-[/bold]" in answered.stdout
    assert LINK in answered.stdout


def test_the_console_escapes_controls_and_reads_no_markup() -> None:
    assert printable(f"a{TITLE}b\u202ec\td\ne") == "a\\x1b]0;pwned\\x07b\\u202ec\td\ne"
    out = SafeConsole(width=200, force_terminal=False, record=True)
    out.print(f"[bold]{LINK}[/bold] :smile: {RED}x")
    assert out.export_text() == f"[bold]{LINK}[/bold] :smile: \\x1b[31mx\n"
