"""Every table ``ctr`` prints, at 80 columns (issue 70: `ctr alerts test` cut each ad id to
"ad-001…", `ctr keys list` showed "advertis…"): no line is wider than the terminal and each row's
identifying values are shown whole; `--wide` shows a row a line; `--json` the full values.
Pure rendering: the tables are built from constructed rows, as each command builds them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from access.key_ring import ApiKey
from access.key_store import create_key, revoke_key
from access.roles import Scope
from alerts import statistics, store
from alerts.evaluate import Finding
from alerts.rules import Measure, Rule
from alerts.settings import AlertSettings
from cli.alerts import findings_listing, findings_record, rules_listing
from cli.batch import previews_listing
from cli.comparison import print_comparison
from cli.console import SafeConsole
from cli.kafka import partitions_listing, status_record
from cli.keys import keys_listing
from cli.main import app
from cli.sql import rows_listing
from cli.tables import Column, Listing, print_json, print_table
from cli.views import versions_listing
from infra.cluster_status import ClusterStatus, PartitionStatus
from lake.coverage.model import CoveredInterval
from lake.settings import LakeSettings
from serving_layer.inventory import VersionInfo
from views.comparison import Change, Comparison

runner = CliRunner()
NOW = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)
ADS = [f"ad-001-{n:02d}" for n in range(1, 13)]
HOOK = "https://hooks.example.com/ctr/acme-dashboard/alerts?signed=1"


def shown(listing: Listing, width: int = 80) -> str:
    buffer = io.StringIO()
    print_table(listing, SafeConsole(width=width, file=buffer, color_system=None))
    return buffer.getvalue()


def assert_readable(text: str, whole: list[str], width: int = 80) -> None:
    """No line wider than ``width``, nothing cut to "…", each of ``whole`` on one line."""
    widest = max(text.splitlines(), key=cell_len)
    assert cell_len(widest) <= width, widest
    assert "…" not in text
    for value in whole:
        assert re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text), (value, text)


def rule(measure: Measure = "ctr") -> Rule:
    made = Rule.create(
        name="ad-ctr",
        measure="ctr",
        where=("campaign_id", "cmp-001"),
        per="ad_id",
        webhook_url=HOOK,
    )
    return dataclasses.replace(made, measure=measure, owner="acme-dashboard", created_at=NOW)


def findings(watched: Rule) -> list[Finding]:
    found = []
    for n, ad in enumerate(ADS, start=1):
        tested = n % 4 != 0
        result = statistics.TestResult(
            0.021 + n / 1000,
            0.021,
            n / 21 - 0.3,
            0.003 if tested else None,
            "" if tested else f"{n * 37} trials < 1000",
        )
        found.append(
            Finding(
                watched,
                ad,
                (NOW - dt.timedelta(minutes=15), NOW),
                result,
                0.0002 * n if tested else None,
                tested and n < 3,
                "approximate" if tested else "too little data",
                40_000 + n,
            )
        )
    return found


def test_alerts_test_shows_every_ad_id_whole() -> None:
    watched = rule()
    text = shown(findings_listing(watched, findings(watched), NOW))
    assert_readable(text, [*ADS, "approximate", "not tested:", "1000"])


def test_alerts_test_of_a_count_says_its_unit_once() -> None:
    watched = rule(measure="clicks")
    result = statistics.TestResult(1234.5, 1540.25, -0.198, 0.0001)
    finding = Finding(watched, None, (NOW, NOW), result, 0.0001, True, "exact", 1)
    text = shown(findings_listing(watched, [finding], NOW))
    assert_readable(text, ["all", "1,234.5", "-19.8%", "exact"])
    assert "now and baseline in events per minute" in " ".join(text.split())
    assert "/min" not in text


def test_alerts_list_keeps_names_and_owners_whole_and_folds_the_url() -> None:
    rules = [rule(), dataclasses.replace(rule(), name="clicks-drop", owner="ctr")]
    text = shown(rules_listing(rules))
    assert_readable(
        text, ["ad-ctr", "clicks-drop", "acme-dashboard", "ctr", "campaign_id=cmp-001,"]
    )


def keys() -> list[ApiKey]:
    advertiser = Scope(("cmp-001", "cmp-002"), tuple(ADS[:2]))
    hour = dt.timedelta(hours=1)
    return [
        ApiKey("acme-dashboard", "advertiser", advertiser, "h", NOW, NOW + 720 * hour, None, NOW),
        ApiKey("bi-team", "analyst", None, "h", NOW, None, None, NOW + 2 * hour),
        ApiKey("ops-admin", "admin", None, "h", NOW, None, NOW + hour, None),
        ApiKey("trial-agency", "advertiser", Scope(("cmp-003",)), "h", NOW, NOW + hour),
    ]


def test_keys_list_keeps_names_and_scopes_whole() -> None:
    text = shown(keys_listing(keys(), NOW + dt.timedelta(hours=3)))
    names = ["acme-dashboard", "bi-team", "ops-admin", "trial-agency"]
    assert_readable(text, [*names, "advertiser:", "analyst:", "admin:", *ADS[:2], "cmp-003"])
    assert_readable(text, ["2026-11-29", "2026-12-29", "active", "revoked", "expired"])


def test_kafka_status_keeps_topics_and_offsets_whole() -> None:
    partitions = [
        PartitionStatus("ad-events", n, n % 3 + 1 if n else -1, (1, 2, 3), (1, 2), 120, 12_345_678)
        for n in range(6)
    ]
    dead = PartitionStatus("ad-events-dlq", 0, 2, (1, 2, 3), (1, 2, 3), 0, 42)
    report = ClusterStatus("abc", {1: "127.0.0.1:9092"}, 1, [*partitions, dead])
    assert_readable(shown(partitions_listing(report)), ["ad-events", "ad-events-dlq", "12,345,678"])
    recorded = json.loads(json.dumps(status_record(report, "127.0.0.1:9092")))
    assert recorded["partitions"][0] == {
        "topic": "ad-events",
        "partition": 0,
        "leader": None,
        "replicas": [1, 2, 3],
        "isr": [1, 2],
        "under_replicated": True,
        "earliest": 120,
        "latest": 12_345_678,
    }


def test_views_list_keeps_versions_and_states_whole() -> None:
    covered = (CoveredInterval(NOW - dt.timedelta(days=9), NOW),)
    infos = [
        VersionInfo(1, "impressions and clicks per minute, every event", None, "retired", (), 0, 0),
        VersionInfo(
            2,
            "as version 1, without devices the ad servers could not classify",
            "device_type <> 'other'",
            "published",
            covered,
            1_234,
            12_345_678,
        ),
        VersionInfo(3, "clicks attributed to their impression", None, "ready", covered, 1, 9),
    ]
    text = shown(versions_listing(infos))
    assert_readable(text, ["published", "retired", "ready", "12,345,678", "2026-11-20"])


def comparison() -> Comparison:
    changes = tuple(
        Change(
            NOW + dt.timedelta(minutes=n),
            {
                "campaign_id": "cmp-001",
                "ad_id": ad,
                "site_id": "site-0042",
                "country": "US",
                "device_type": "desktop",
            },
            (12_345, 12_400),
            (310, 298),
            (320, 330),
        )
        for n, ad in enumerate(ADS)
    )
    return Comparison(
        "ctr",
        "now",
        "after the recompute",
        NOW,
        NOW + dt.timedelta(hours=1),
        5_400,
        120,
        3,
        0,
        (1_234_567, 1_234_600),
        (34_567, 34_500),
        changes,
        raw_clicks=(35_000, 35_010),
    )


def test_a_comparison_keeps_each_rows_dimensions_whole() -> None:
    buffer = io.StringIO()
    print_comparison(comparison(), SafeConsole(width=80, file=buffer, color_system=None))
    text = buffer.getvalue()
    assert_readable(text, [*ADS, "site-0042", "desktop", "12,345", "12,400"])


def test_a_backfill_preview_keeps_each_hour_whole() -> None:
    later = dataclasses.replace(comparison(), start=NOW + dt.timedelta(hours=1))
    text = shown(previews_listing([comparison(), later]))
    assert_readable(text, ["2026-11-29 10:00", "2026-11-29 11:00", "1,234,567", "(+33)"])


def test_sql_answers_keep_values_whole_and_headers_may_wrap() -> None:
    columns = ["bucket_start", "campaign_id", "ad_id", "site_id", "country", "device_type"]
    columns += ["impressions", "clicks"]
    rows: list[list[object]] = [
        [NOW.isoformat(), "cmp-001", ad, "site-0042", "US", "desktop", 1234, 31] for ad in ADS
    ]
    assert_readable(shown(rows_listing(columns, rows)), [*ADS, "site-0042", "desktop"])


def test_ids_fold_rather_than_be_cut_when_not_even_they_fit() -> None:
    listing = Listing(Column("ad", whole=True), Column("site", whole=True), "url")
    listing.add_row("ad-001-01", "site-0042", HOOK)
    text = shown(listing, width=16)
    assert_readable(text, [], width=16)
    rows = text.splitlines()[3:]  # below the header
    assert "".join(row.split("│")[0].strip() for row in rows) == "ad-001-01"
    assert "".join(row.split("│")[1].strip() for row in rows if "│" in row) == "site-0042"


def test_wide_shows_each_row_on_one_line() -> None:
    watched = rule()
    buffer = io.StringIO()
    print_table(rules_listing([watched]), SafeConsole(width=80, file=buffer), wide=True)
    text = buffer.getvalue()
    [row] = [line for line in text.splitlines() if "ad-ctr" in line]
    assert HOOK in row
    assert watched.describe() in row


def test_json_writes_times_in_iso_and_every_value_in_full(
    capsys: pytest.CaptureFixture[str],
) -> None:
    watched = rule()
    print_json(findings_record(watched, findings(watched), NOW, None))
    printed = json.loads(capsys.readouterr().out)
    assert printed["window_end"] == "2026-11-29T10:00:00+00:00"
    assert [f["group"] for f in printed["findings"]] == ADS
    assert printed["findings"][3]["reason"] == "148 trials < 1000"
    assert printed["findings"][0]["window_start"] == "2026-11-29T09:45:00+00:00"


# The commands themselves, over a lake of keys and rules.


def env(lake: LakeSettings) -> dict[str, str]:
    return {"LAKE_ROOT": str(lake.lake_root), "COLUMNS": "80"}


def test_keys_list_json_has_stable_keys_and_full_times(lake: LakeSettings) -> None:
    create_key(lake, "acme-dashboard", "advertiser", campaigns=["cmp-001"], allow_unknown=True)
    create_key(lake, "ops-admin", "admin")
    revoke_key(lake, "ops-admin")
    result = runner.invoke(app, ["keys", "list", "--all", "--json"], env=env(lake))
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)["keys"]
    assert [k["name"] for k in printed] == ["acme-dashboard", "ops-admin"]
    assert set(printed[0]) == {
        "name",
        "scope",
        "campaigns",
        "ads",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
        "status",
    }
    assert (printed[0]["scope"], printed[0]["campaigns"], printed[0]["ads"]) == (
        "advertiser",
        ["cmp-001"],
        None,
    )
    assert (printed[1]["status"], printed[1]["campaigns"]) == ("revoked", None)
    assert dt.datetime.fromisoformat(printed[1]["revoked_at"]).tzinfo is not None


def test_alerts_list_json_never_shows_a_secret(lake: LakeSettings) -> None:
    stored = store.create_rule(
        lake, Rule.create(name="ad-ctr", measure="ctr", webhook_url=HOOK), AlertSettings()
    )
    result = runner.invoke(app, ["alerts", "list", "--json"], env=env(lake))
    assert result.exit_code == 0, result.output
    [printed] = json.loads(result.stdout)["rules"]
    assert (printed["name"], printed["webhook_url"], printed["owner"]) == ("ad-ctr", HOOK, "ctr")
    assert "secret" not in printed
    assert stored.secret not in result.stdout


@pytest.mark.parametrize(
    "args", [["keys", "list"], ["alerts", "list"], ["views", "list"], ["kafka", "status"]]
)
def test_json_and_wide_are_one_or_the_other(args: list[str], tmp_path: Path) -> None:
    result = runner.invoke(app, [*args, "--json", "--wide"], env={"LAKE_ROOT": str(tmp_path)})
    assert result.exit_code == 2
    assert "--json or --wide, not both" in result.output
