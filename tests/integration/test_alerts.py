"""CTR alerts over a real lake (Delta tables written as the layers write them, read through the
serving layer's merge rule in DuckDB): rules stored and scoped, the evaluator's minutes
committed once (restarts included), its hysteresis, its re-check once the batch layer covers
an alert's window, and its webhooks delivered, signed, to a real local HTTP receiver."""

from __future__ import annotations

import datetime as dt
import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from access.roles import Access, Scope
from alerts import store, webhooks
from alerts.lake_counts import LakeCounts
from alerts.rules import Rule, RuleError
from alerts.runner import APP_ID, Evaluator, minute_index
from alerts.settings import AlertSettings
from infra.broker import free_port
from lake.settings import LakeSettings
from serving_layer.reader import SnapshotReader
from tests.support.lake_writer import cover, speed_row, write_batch, write_speed, write_status

END = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)
# The tests' receivers listen on loopback: allowed here as an operator would allow an internal
# receiver (ALERTS_WEBHOOK_ALLOW); nothing else inside is.
SETTINGS = AlertSettings(webhook_allow="127.0.0.1")


def _rows(*, day: int, minutes: range, drop: bool) -> list[dict[str, object]]:
    """Per minute of ``minutes`` (relative to END), ``day`` days before END: two ads of
    cmp-1 with 1,000 impressions a minute at 2 % CTR; with ``drop``, ad-2 at 1 %."""
    rows = []
    for m in minutes:
        at = END - dt.timedelta(days=day) + m * MINUTE
        for ad in ("ad-1", "ad-2"):
            clicks = 10 if drop and ad == "ad-2" else 20
            rows.append(speed_row(at, 1000, clicks, clicks, campaign="cmp-1", ad=ad))
    return rows


@pytest.fixture
def dropped(lake: LakeSettings) -> LakeSettings:
    """Seven days of steady traffic around END's time of day, and today ad-2's CTR halved from
    15 minutes before END on (the speed layer's counts)."""
    rows = [r for day in range(1, 8) for r in _rows(day=day, minutes=range(-20, 3), drop=False)]
    rows += _rows(day=0, minutes=range(-20, -15), drop=False)
    rows += _rows(day=0, minutes=range(-15, 3), drop=True)
    write_speed(lake, rows)
    return lake


class Receiver:
    """A local webhook receiver: records each POST; answers ``status`` (with ``location``)."""

    def __init__(self, status: int = 200, location: str | None = None) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        received, answer = self.received, status

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((dict(self.headers), body))
                self.send_response(answer)
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


def _evaluator(
    lake: LakeSettings,
    reader: SnapshotReader,
    attempts: int = 5,
    *,
    deliver: Callable[..., webhooks.Delivery] = webhooks.deliver,
    **settings: Any,
) -> Evaluator:
    knobs = SETTINGS.model_copy(
        update={
            "fire_after": 2,
            "resolve_after": 2,
            "webhook_first_delay_s": 0,
            "webhook_attempts": attempts,
            **settings,
        }
    )
    return Evaluator(lake, knobs, lambda: LakeCounts(reader), deliver=deliver)


def _events(lake: LakeSettings, *kinds: str) -> list[dict[str, object]]:
    return store.read_events(lake, since=END - dt.timedelta(hours=1), events=kinds)


def test_rules_are_stored_scoped_and_deleted(lake: LakeSettings) -> None:
    rule = Rule.create(name="cmp-1-ctr", measure="ctr", where=("campaign_id", "cmp-1"))
    stored = store.create_rule(lake, rule, SETTINGS)
    assert len(stored.secret) > 30
    assert store.read_rules(lake)["ctr/cmp-1-ctr"].secret == stored.secret
    with pytest.raises(RuleError, match="exists"):
        store.create_rule(lake, rule, SETTINGS)
    mine = Access("adv", "advertiser", Scope.create(["cmp-2"]))
    with pytest.raises(RuleError, match="not in this key's scope"):
        store.create_rule(
            lake, Rule.create(name="x", measure="ctr", where=rule.where), SETTINGS, access=mine
        )
    own = Rule.create(name="cmp-2-ctr", measure="ctr", where=("campaign_id", "cmp-2"))
    assert store.create_rule(lake, own, SETTINGS, access=mine).owner == "adv"
    assert set(store.visible(store.read_rules(lake), mine)) == {"adv/cmp-2-ctr"}
    with pytest.raises(RuleError, match="no rule is named"):
        store.delete_rule(lake, "cmp-1-ctr", access=mine)
    store.delete_rule(lake, "cmp-1-ctr")
    assert set(store.read_rules(lake)) == {"adv/cmp-2-ctr"}


def test_rule_names_are_per_owner_and_a_key_has_so_many(lake: LakeSettings) -> None:
    """Issue 66, finding 7: names were global (one tenant learnt another's and could squat
    them); finding 1: no cap on rules per key."""
    capped = SETTINGS.model_copy(update={"max_rules_per_owner": 2})
    acme = Access("acme", "advertiser", Scope.create(["cmp-1"]))
    globex = Access("globex", "advertiser", Scope.create(["cmp-2"]))
    for access, campaign in ((None, "cmp-1"), (acme, "cmp-1"), (globex, "cmp-2")):
        rule = Rule.create(name="ad-ctr", measure="ctr", where=("campaign_id", campaign))
        store.create_rule(lake, rule, capped, access=access)
    rules = store.read_rules(lake)
    assert set(rules) == {"ctr/ad-ctr", "acme/ad-ctr", "globex/ad-ctr"}
    # Two rules of the name: the command line says whose to delete; an advertiser its own.
    with pytest.raises(RuleError, match="3 owners have a rule named 'ad-ctr': acme, ctr, globex"):
        store.delete_rule(lake, "ad-ctr")
    with pytest.raises(RuleError, match="no rule is named"):
        store.delete_rule(lake, "ad-ctr", owner="globex", access=acme)
    assert store.delete_rule(lake, "ad-ctr", access=acme).owner == "acme"
    assert set(store.read_rules(lake)) == {"ctr/ad-ctr", "globex/ad-ctr"}
    # The cap counts the owner's rules only.
    second = Rule.create(name="two", measure="clicks", where=("campaign_id", "cmp-2"))
    store.create_rule(lake, second, capped, access=globex)
    third = Rule.create(name="three", measure="clicks", where=("campaign_id", "cmp-2"))
    with pytest.raises(RuleError, match="this key has 2 rules"):
        store.create_rule(lake, third, capped, access=globex)
    acmes = Rule.create(name="three", measure="clicks", where=("campaign_id", "cmp-1"))
    assert store.create_rule(lake, acmes, capped, access=acme).owner == "acme"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/api/v2/dags",  # Airflow's API on loopback
        "http://localhost:9092/",
        "http://[::1]:8080/",
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "http://10.0.0.1/",
        "http://0x7f000001/",  # 127.0.0.1, written as a number the resolver accepts
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
    ],
)
def test_a_webhook_inside_the_network_is_refused_when_the_rule_is_made(
    lake: LakeSettings, url: str
) -> None:
    """Issue 66, finding 1: an advertiser's webhook on an internal address made the evaluator
    a port scanner; refused at creation (and at delivery: below)."""
    mine = Access("adv", "advertiser", Scope.create(["cmp-1"]))
    rule = Rule.create(name="x", measure="ctr", where=("campaign_id", "cmp-1"), webhook_url=url)
    with pytest.raises(RuleError, match="not a public address") as refused:
        store.create_rule(lake, rule, AlertSettings(), access=mine)
    assert refused.value.parameter == "webhook_url"
    assert store.read_rules(lake) == {}


def test_the_lake_counts_a_window_through_the_merge_rule(dropped: LakeSettings) -> None:
    reader = SnapshotReader(dropped, refresh_s=0)
    try:
        counts = LakeCounts(reader).counts((END - 15 * MINUTE, END), ("ad_id",))
    finally:
        reader.close()
    assert counts[("ad-1",)].impressions == 15_000
    assert counts[("ad-1",)].clicks == 300
    assert counts[("ad-2",)].clicks == 150
    assert not counts[("ad-2",)].exact  # the speed layer's


def test_the_evaluator_fires_once_confirms_and_delivers_signed(
    dropped: LakeSettings, receiver: Receiver
) -> None:
    rule = Rule.create(
        name="ads", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id",
        direction="drop", webhook_url=receiver.url,
    )  # fmt: skip
    secret = store.create_rule(dropped, rule, SETTINGS).secret
    reader = SnapshotReader(dropped, refresh_s=0)
    try:
        evaluator = _evaluator(dropped, reader)
        first = evaluator.tick(END)
        assert first.committed
        assert first.alerts == []  # significant once: fire_after is 2
        second = evaluator.tick(END + MINUTE)
        assert [(a["event"], a["group_value"], a["evidence"]) for a in second.alerts] == [
            ("fired", "ad-2", "approximate")
        ]
        assert not evaluator.tick(END + MINUTE).committed  # the same minute: once
        evaluator.close()
        # A restart picks up the firing alert: no second "fired".
        again = _evaluator(dropped, reader)
        assert again.tick(END + 2 * MINUTE).alerts == []
        # The batch layer covers the fired window with the same counts: the alert is confirmed.
        window = [r for r in _rows(day=0, minutes=range(-14, 1), drop=True)]
        write_batch(
            dropped,
            "run-1",
            [
                {k: v for k, v in r.items() if "attributed" not in k and "_clicks" not in k}
                for r in window
            ],
        )
        cover(dropped, "run-1", END - 14 * MINUTE, END + MINUTE)
        confirmed = again.tick(END + 3 * MINUTE)
        assert [(a["event"], a["evidence"]) for a in confirmed.alerts] == [("confirmed", "exact")]
        again.close()
    finally:
        reader.close()
    assert store.last_version(dropped, APP_ID) == minute_index(END + 3 * MINUTE)
    kinds = [r["event"] for r in _events(dropped, "fired", "confirmed", "delivered")]
    assert kinds.count("fired") == 1
    assert kinds.count("confirmed") == 1
    # Both alerts posted, each signed with the rule's secret.
    assert len(receiver.received) == 2
    for headers, body in receiver.received:
        assert webhooks.verify(secret, headers["X-Ctr-Timestamp"], body, headers["X-Ctr-Signature"])
    fired = orjson.loads(receiver.received[0][1])
    assert fired["alert"] == "fired"
    assert fired["group"] == {"ad_id": "ad-2"}
    assert fired["change"] == pytest.approx(-0.5)


def test_while_the_speed_layer_catches_up_a_drop_is_not_tested_and_then_it_is(
    dropped: LakeSettings,
) -> None:
    rule = Rule.create(name="ads", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id")
    store.create_rule(dropped, rule, SETTINGS)
    reader = SnapshotReader(dropped, refresh_s=0)
    evaluator = _evaluator(dropped, reader)

    def status(read_to: dt.datetime, at: dt.datetime) -> None:
        # What the speed job reports: its watermark is the newest event it read less 10 min.
        watermark = read_to - dt.timedelta(minutes=10)
        write_status(dropped, updated_at=at.isoformat(), watermark=watermark.isoformat(),
                     watermark_delay_ms=600_000, offsets_behind=250_000)  # fmt: skip

    try:
        # A restart's backlog: at 12:01:30 the job had read events up to 11:40.
        status(END - 20 * MINUTE, END + 1.5 * MINUTE)
        for minute in range(3):
            tick = evaluator.tick(END + minute * MINUTE)
            assert tick.alerts == []
            assert tick.held is not None
            assert "catching up" in tick.held
            assert "up to 11:40:00, 22 min behind, 250,000 records to go" in tick.held
            assert not any(r["significant"] for r in tick.rows)
            assert {r["evidence"] for r in tick.rows} == {"too little data"}
        # Caught up (read to 12:04:58 at 12:05): the drop is tested, and fires after two.
        status(END + 5 * MINUTE - dt.timedelta(seconds=2), END + 5 * MINUTE)
        assert evaluator.tick(END + 3 * MINUTE).held is None
        fired = evaluator.tick(END + 4 * MINUTE).alerts
        assert [(a["event"], a["group_value"]) for a in fired] == [("fired", "ad-2")]
        # A job caught up and then idle (no traffic since) is not behind: an outage is seen.
        status(END - 20 * MINUTE, END - 20 * MINUTE + dt.timedelta(seconds=3))
        assert evaluator.tick(END + 5 * MINUTE).held is None
    finally:
        evaluator.close()
        reader.close()


def test_a_webhook_that_keeps_failing_becomes_a_dead_letter(dropped: LakeSettings) -> None:
    failing = Receiver(status=503)
    rule = Rule.create(name="ads", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id",
                       webhook_url=failing.url)  # fmt: skip
    store.create_rule(dropped, rule, SETTINGS)
    _fire(dropped, attempts=3)
    failing.close()
    assert len(failing.received) == 3
    (dead,) = _events(dropped, "dead_letter")
    # What the rule's owner reads: one word, never the receiver's answer.
    assert (dead["delivery"], dead["reason"]) == ("failed", None)


def _fire(
    lake: LakeSettings,
    deliver: Callable[..., webhooks.Delivery] = webhooks.deliver,
    **settings: Any,
) -> None:
    """Two evaluations (ad-2's drop fires on the second), the deliveries waited for, and a third
    evaluation that records their outcomes."""
    reader = SnapshotReader(lake, refresh_s=0)
    try:
        evaluator = _evaluator(lake, reader, deliver=deliver, **settings)
        evaluator.tick(END)
        evaluator.tick(END + MINUTE)
        evaluator.close()  # waits for the deliveries
        evaluator.tick(END + 2 * MINUTE)  # records their outcome
    finally:
        reader.close()


def test_a_webhook_whose_name_turns_inside_is_refused_at_delivery(
    dropped: LakeSettings, receiver: Receiver
) -> None:
    """A name that resolved to a public address when the rule was made and to loopback when
    the alert is sent (DNS rebinding): nothing is sent, the owner reads "refused"."""
    port = receiver.server.server_port
    answers = iter([["93.184.216.34"], ["127.0.0.1"], ["127.0.0.1"]])

    def rebinding(host: str, port: int) -> list[str]:
        assert host == "hooks.example"
        return next(answers)

    rule = Rule.create(name="ads", measure="ctr", where=("campaign_id", "cmp-1"), per="ad_id",
                       webhook_url=f"http://hooks.example:{port}/hook")  # fmt: skip
    strict = AlertSettings()  # no internal destination allowed
    store.create_rule(dropped, rule, strict, resolver=rebinding)
    _fire(dropped, functools.partial(webhooks.deliver, resolver=rebinding), webhook_allow="")
    assert receiver.received == []
    (dead,) = _events(dropped, "dead_letter")
    assert (dead["delivery"], dead["reason"]) == ("refused", None)


def test_a_delivery_goes_to_the_address_checked_and_follows_no_redirect(
    dropped: LakeSettings, receiver: Receiver
) -> None:
    """The connection goes to the address the name resolved to when it was checked (not a
    second lookup), with the URL's host in the Host header; a redirect (to an inside address
    the policy would refuse, say) is a failure, not followed."""
    port = receiver.server.server_port
    redirecting = Receiver(status=307, location=receiver.url)
    allowed = AlertSettings(webhook_allow="hooks.example,redirect.example")
    names = {"hooks.example": ["127.0.0.1"], "redirect.example": ["127.0.0.1"]}

    def resolve(host: str, port: int) -> list[str]:
        return names[host]

    for name, url in (
        ("pinned", f"http://hooks.example:{port}/hook?x=1"),
        ("redirected", f"http://redirect.example:{redirecting.server.server_port}/r"),
    ):
        rule = Rule.create(name=name, measure="ctr", where=("campaign_id", "cmp-1"),
                           per="ad_id", webhook_url=url)  # fmt: skip
        store.create_rule(dropped, rule, allowed, resolver=resolve)
    _fire(dropped, functools.partial(webhooks.deliver, resolver=resolve),
          webhook_allow="hooks.example,redirect.example")  # fmt: skip
    redirecting.close()
    ((headers, _),) = receiver.received  # the pinned rule's alert only: no redirect followed
    assert headers["Host"] == f"hooks.example:{port}"
    assert len(redirecting.received) == 1  # one try: a 3xx is not retried either
    outcomes = {str(r["rule"]): r["delivery"] for r in _events(dropped, "delivered", "dead_letter")}
    assert outcomes == {"pinned": "delivered", "redirected": "failed"}


def test_an_owners_deliveries_are_capped_per_minute(
    dropped: LakeSettings, receiver: Receiver
) -> None:
    for name in ("first", "second", "third"):
        rule = Rule.create(name=name, measure="ctr", where=("campaign_id", "cmp-1"),
                           per="ad_id", webhook_url=receiver.url)  # fmt: skip
        store.create_rule(dropped, rule, SETTINGS)
    _fire(dropped, max_deliveries_per_minute=2)
    assert len(receiver.received) == 2
    outcomes = sorted(str(r["delivery"]) for r in _events(dropped, "delivered", "dead_letter"))
    assert outcomes == ["delivered", "delivered", "throttled"]


def test_the_command_line_creates_lists_tests_and_deletes(
    dropped: LakeSettings, tmp_path: Path
) -> None:
    env = {**os.environ, "LAKE_ROOT": str(dropped.lake_root), "COLUMNS": "250"}
    ctr = [str(Path(sys.executable).parent / "ctr"), "alerts"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ctr, *args], env=env, capture_output=True, text=True, check=False, timeout=120
        )

    created = run("create", "ads", "--where", "campaign_id=cmp-1", "--per", "ad_id")
    assert created.returncode == 0, created.stderr
    assert len(created.stdout.strip().splitlines()[-1]) > 30  # the secret, alone
    assert "ctr of campaign_id=cmp-1, per ad_id" in run("list").stderr
    tested = run("test", "ads", "--at", END.isoformat())
    assert tested.returncode == 0, tested.stderr
    assert "ad-2" in tested.stderr
    assert "-50.0%" in tested.stderr
    bad = run("create", "x", "--where", "campaign_id")
    assert bad.returncode == 2
    assert "--where" in bad.stderr
    wrong = run("create", "y", "--measure", "revenue")
    assert wrong.returncode == 1
    assert "--measure: one of ctr, impressions, clicks, orphan_share" in wrong.stderr
    assert run("delete", "ads").returncode == 0
    assert "no rules" in run("list").stderr
