"""/api/v1/alerts over the real API (uvicorn on a loopback port, real Delta tables): rules
listed, created and deleted by admin and analyst keys, an advertiser's limited to its own
campaigns, bad bodies refused naming the field, and the alerts a real evaluator wrote to
alerts/events, newest first, with whether each is open now."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from pydantic import SecretStr

from access.key_store import create_key
from alerts import store
from alerts.lake_counts import LakeCounts
from alerts.runner import Evaluator
from alerts.settings import AlertSettings
from api.settings import ApiSettings
from lake.settings import LakeSettings
from serving_layer.reader import SnapshotReader
from tests.integration.test_alerts import END, MINUTE, _rows
from tests.support.api_server import running_api
from tests.support.lake_writer import write_speed
from tests.support.lakes import new_lake

TOKEN: Final = "alerts-api-test-token-0123456789"
PATH: Final = "/api/v1/alerts"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    """Seven days of steady traffic of cmp-1's two ads around END's time of day, and today
    ad-2's CTR halved from 15 minutes before END on (the speed layer's counts)."""
    lake = new_lake(tmp_path_factory.mktemp("alerts-api-lake"))
    rows = [r for day in range(1, 8) for r in _rows(day=day, minutes=range(-20, 3), drop=False)]
    rows += _rows(day=0, minutes=range(-20, -15), drop=False)
    rows += _rows(day=0, minutes=range(-15, 3), drop=True)
    write_speed(lake, rows)
    return lake


@pytest.fixture(scope="module")
def base_url(lake: LakeSettings) -> Iterator[str]:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, cache_stale_s=0)
    with running_api(settings, lake) as url:
        yield url


class Client:
    """Requests to the API with one key."""

    def __init__(self, base_url: str, key: str) -> None:
        self.url = base_url + PATH
        self.headers = {"Authorization": f"Bearer {key}"}

    def rules(self) -> dict[str, dict[str, Any]]:
        """The rules it sees by name (the tests' names are one owner's each)."""
        return {r["name"]: r for r in self.every_rule()}

    def every_rule(self) -> list[dict[str, Any]]:
        answer = httpx.get(self.url, headers=self.headers, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["rules"]  # type: ignore[no-any-return]

    def create(self, **body: object) -> httpx.Response:
        return httpx.post(self.url, json=body, headers=self.headers, timeout=30)

    def post(self, content: bytes) -> httpx.Response:
        headers = {**self.headers, "Content-Type": "application/json"}
        return httpx.post(self.url, content=content, headers=headers, timeout=30)

    def delete(self, name: str, owner: str | None = None) -> httpx.Response:
        params = {"owner": owner} if owner else {}
        return httpx.delete(f"{self.url}/{name}", params=params, headers=self.headers, timeout=30)

    def events(self, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}/events", params=params, headers=self.headers, timeout=30)


def _client(base_url: str, lake: LakeSettings, name: str, role: str, *campaigns: str) -> Client:
    _, key = create_key(lake, name, role, campaigns=campaigns, allow_unknown=True)
    return Client(base_url, key)


def _refused(answer: httpx.Response, status: int, parameter: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["parameter"] == parameter, body
    assert str(body["detail"]).startswith(f"{parameter}: "), body
    return str(body["detail"])


def test_admin_and_analyst_list_create_and_delete(base_url: str, lake: LakeSettings) -> None:
    admin = Client(base_url, TOKEN)
    analyst = _client(base_url, lake, "ana", "analyst")
    created = analyst.create(
        name="cmp-1-ctr",
        where={"dimension": "campaign_id", "value": "cmp-1"},
        direction="drop",
        webhook_url="https://hooks.example/ctr",
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert len(body["secret"]) > 30  # shown once: here
    assert body["owner"] == "ana"
    assert body["where"] == {"dimension": "campaign_id", "value": "cmp-1"}
    assert body["measure"] == "ctr"
    assert body["window_minutes"] == 15
    assert "fires on a drop of at least 20%" in body["description"]
    assert store.read_rules(lake)["ana/cmp-1-ctr"].secret == body["secret"]
    seen = admin.rules()["cmp-1-ctr"]
    assert "secret" not in seen
    assert seen == {k: v for k, v in body.items() if k != "secret"}
    assert analyst.rules()["cmp-1-ctr"] == seen
    # Every row (no where) is an admin's or an analyst's to watch.
    assert admin.create(name="everything", measure="impressions").status_code == 201
    # A name in use: refused, naming it.
    assert "exists" in _refused(analyst.create(name="cmp-1-ctr"), 400, "name")
    # Either key deletes any rule, naming its owner (its own by default); then it is gone, and
    # deleting it again is a 404.
    _refused(admin.delete("cmp-1-ctr"), 404, "name")  # the admin has none of that name
    assert admin.delete("cmp-1-ctr", owner="ana").status_code == 204
    assert analyst.delete("everything", owner="API_TOKEN").status_code == 204
    assert not {"cmp-1-ctr", "everything"} & set(admin.rules())
    _refused(analyst.delete("cmp-1-ctr"), 404, "name")
    assert httpx.get(base_url + PATH).status_code == 401


def test_an_advertiser_sees_and_manages_only_its_campaigns(
    base_url: str, lake: LakeSettings
) -> None:
    admin = Client(base_url, TOKEN)
    mine = _client(base_url, lake, "acme", "advertiser", "cmp-1")
    other = _client(base_url, lake, "globex", "advertiser", "cmp-2")
    for name, where in (("all-rows", None), ("cmp-2-rule", ("campaign_id", "cmp-2"))):
        body = {"dimension": where[0], "value": where[1]} if where else None
        assert admin.create(name=name, where=body).status_code == 201
    own = mine.create(name="acme-ads", where={"dimension": "campaign_id", "value": "cmp-1"})
    assert own.status_code == 201, own.text
    assert own.json()["owner"] == "acme"
    # An ad of its campaigns (issue 66, finding 7: refused before): its counts are its
    # campaigns' rows of that ad.
    ad = mine.create(name="acme-ad", where={"dimension": "ad_id", "value": "ad-1"})
    assert ad.status_code == 201, ad.text
    # Another's campaign, or every row: refused, naming `where`.
    theirs = mine.create(name="x", where={"dimension": "campaign_id", "value": "cmp-2"})
    assert "not in this key's scope" in _refused(theirs, 400, "where")
    _refused(mine.create(name="y"), 400, "where")
    _refused(mine.create(name="z", where={"dimension": "country", "value": "US"}), 400, "where")
    # Each sees its campaigns' rules only; the admin sees them all.
    assert "acme-ads" in mine.rules()
    assert not {"all-rows", "cmp-2-rule"} & set(mine.rules())
    assert "cmp-2-rule" in other.rules()
    assert not {"acme-ads", "all-rows"} & set(other.rules())
    assert {"all-rows", "cmp-2-rule", "acme-ads"} <= set(admin.rules())
    # Another's rule is not there to delete: 404, and it stays.
    _refused(mine.delete("cmp-2-rule"), 404, "name")
    _refused(mine.delete("all-rows"), 404, "name")
    assert {"all-rows", "cmp-2-rule"} <= set(admin.rules())
    assert other.delete("acme-ads").status_code == 404
    assert mine.delete("acme-ads").status_code == 204
    assert mine.delete("acme-ad").status_code == 204
    assert not {"acme-ads", "acme-ad"} & set(admin.rules())
    for name in ("all-rows", "cmp-2-rule"):
        assert admin.delete(name).status_code == 204


@pytest.mark.parametrize(
    ("body", "parameter"),
    [
        ({"measure": "ctr"}, "name"),
        ({"name": "bad name!"}, "name"),
        ({"name": "r", "measure": "revenue"}, "measure"),
        ({"name": "r", "where": {"dimension": "campaign"}}, "where.dimension"),
        ({"name": "r", "where": {"dimension": "campaign_id", "value": ""}}, "where"),
        ({"name": "r", "per": "city"}, "per"),
        ({"name": "r", "where": {"dimension": "ad_id", "value": "a"}, "per": "ad_id"}, "per"),
        ({"name": "r", "window_minutes": 0}, "window_minutes"),
        ({"name": "r", "window_minutes": "soon"}, "window_minutes"),
        ({"name": "r", "baseline": "weeks"}, "baseline"),
        ({"name": "r", "baseline_days": 29}, "baseline_days"),
        ({"name": "r", "baseline": "previous", "baseline_minutes": 5}, "baseline_minutes"),
        ({"name": "r", "alpha": 0.5}, "alpha"),
        ({"name": "r", "min_effect": -0.1}, "min_effect"),
        ({"name": "r", "direction": "down"}, "direction"),
        ({"name": "r", "min_trials": -1}, "min_trials"),
        ({"name": "r", "webhook_url": "ftp://hooks.example"}, "webhook_url"),
        ({"name": "r", "window": 15}, "window"),  # a field that does not exist
    ],
)
def test_a_bad_body_is_refused_naming_the_field(
    base_url: str, body: dict[str, object], parameter: str
) -> None:
    _refused(Client(base_url, TOKEN).create(**body), 400, parameter)


def test_a_body_that_is_not_a_rule_is_refused(base_url: str) -> None:
    admin = Client(base_url, TOKEN)
    for content in (b"not json", b"[1, 2]"):
        answer = admin.post(content)
        assert answer.status_code == 400, answer.text
    assert "r" not in admin.rules()


SINCE: Final = {"since": (END - dt.timedelta(hours=1)).isoformat()}


@pytest.fixture(scope="module")
def fired(base_url: str, lake: LakeSettings) -> dict[str, Any]:
    """Rule ``ads`` (cmp-1's CTR per ad, drops) created over the API, and its alert fired by a
    real evaluator's two minutes: the alert as GET /api/v1/alerts/events answers it."""
    admin = Client(base_url, TOKEN)
    created = admin.create(
        name="ads",
        where={"dimension": "campaign_id", "value": "cmp-1"},
        per="ad_id",
        direction="drop",
    )
    assert created.status_code == 201, created.text
    assert admin.events(**SINCE).json() == {"events": [], "open": [], "truncated": False}
    reader = SnapshotReader(lake, refresh_s=0)
    evaluator = Evaluator(lake, AlertSettings(fire_after=2), lambda: LakeCounts(reader))
    try:
        assert evaluator.tick(END).alerts == []
        assert [a["event"] for a in evaluator.tick(END + MINUTE).alerts] == ["fired"]
    finally:
        evaluator.close()
        reader.close()
    answer = admin.events(**SINCE)
    assert answer.status_code == 200, answer.text
    (alert,) = [e for e in answer.json()["events"] if e["rule"] == "ads"]
    return alert  # type: ignore[no-any-return]


def test_the_events_are_the_evaluators_alerts(base_url: str, fired: dict[str, Any]) -> None:
    assert fired["event"] == "fired"
    assert fired["group_value"] == "ad-2"
    assert fired["campaign_id"] == "cmp-1"
    assert fired["evidence"] == "approximate"  # the speed layer's counts
    assert fired["change"] == pytest.approx(-0.5)
    assert fired["current"] == pytest.approx(0.01)
    assert fired["baseline"] == pytest.approx(0.02)
    assert fired["p_value"] < 0.01
    assert fired["significant"] is True
    assert _time(fired["window_start"]) == END + MINUTE - 15 * MINUTE
    assert _time(fired["window_end"]) == END + MINUTE
    assert fired["open"] is True
    admin = Client(base_url, TOKEN)
    assert admin.events(**SINCE).json()["open"] == [fired]
    # The evaluations on asking, newest first; the limit says it cut.
    every = admin.events(**SINCE, evaluated="true", limit=3).json()
    assert every["truncated"] is True
    assert len(every["events"]) == 3
    times = [_time(e["at"]) for e in every["events"]]
    assert times == sorted(times, reverse=True)
    assert times[-1] == END + MINUTE
    assert {e["event"] for e in every["events"]} <= {"evaluated", "fired"}
    # Since after its window ended: not listed, but open all the same.
    later = admin.events(since=(END + 5 * MINUTE).isoformat()).json()
    assert later["events"] == []
    assert later["open"] == [fired]
    _refused(admin.events(since="yesterday"), 400, "since")
    _refused(admin.events(limit=0), 400, "limit")


def test_only_the_keys_that_see_a_rule_see_its_alerts(
    base_url: str, lake: LakeSettings, fired: dict[str, Any]
) -> None:
    acme = _client(base_url, lake, "acme-events", "advertiser", "cmp-1")
    globex = _client(base_url, lake, "globex-events", "advertiser", "cmp-2")
    analyst = _client(base_url, lake, "ana-events", "analyst")
    assert acme.events(**SINCE).json()["open"] == [fired]
    assert analyst.events(**SINCE).json()["events"] == [fired]
    assert globex.events(**SINCE).json() == {"events": [], "open": [], "truncated": False}


def test_a_key_limited_to_ads_sees_and_is_sent_nothing_of_other_ads(
    base_url: str, lake: LakeSettings, fired: dict[str, Any]
) -> None:
    """Issue 66, finding 4: a key limited to cmp-1's ad-1 made a rule on cmp-1 per ad_id and
    read every other ad's per-minute impressions in its evaluations; it saw the admin's rule on
    cmp-1 and its alerts on ad-2 too. Rule names are per owner (finding 7): its "ads" is not
    the admin's."""
    _, key = create_key(lake, "narrow", "advertiser", campaigns=["cmp-1"], ads=["ad-1"],
                        allow_unknown=True)  # fmt: skip
    narrow = Client(base_url, key)
    acme = _client(base_url, lake, "acme-wide", "advertiser", "cmp-1")
    created = narrow.create(
        name="ads", where={"dimension": "campaign_id", "value": "cmp-1"}, per="ad_id"
    )
    assert created.status_code == 201, created.text
    # Neither the admin's rule of the same name nor its alert on ad-2 is the narrow key's.
    assert [(r["owner"], r["name"]) for r in narrow.every_rule()] == [("narrow", "ads")]
    assert narrow.events(**SINCE).json() == {"events": [], "open": [], "truncated": False}
    # A key that sees the whole campaign sees both rules, the other key's without its webhook.
    assert {(r["owner"], r["name"]) for r in acme.every_rule()} >= {
        ("narrow", "ads"), ("API_TOKEN", "ads")
    }  # fmt: skip
    reader = SnapshotReader(lake, refresh_s=0)
    evaluator = Evaluator(lake, AlertSettings(fire_after=2), lambda: LakeCounts(reader))
    try:
        evaluator.tick(END + 2 * MINUTE)
    finally:
        evaluator.close()
        reader.close()
    evaluated = narrow.events(**SINCE, evaluated="true").json()["events"]
    assert {(e["owner"], e["rule"], e["group_value"]) for e in evaluated} == {
        ("narrow", "ads", "ad-1")
    }
    # In the lake too: the rule counted ad-1's rows only (not ad-2's, nor their sum).
    rows = store.read_events(lake, since=END, events=["evaluated"])
    mine = [r for r in rows if r["owner"] == "narrow"]
    assert [(r["group_value"], r["trials"]) for r in mine] == [("ad-1", 15_000)]
    # Rows written before rules were narrowed (no owner) may count other ads: not shown.
    legacy = {**mine[0], "owner": None, "group_value": "ad-2", "at": END + 3 * MINUTE}
    store.append_events(lake, [legacy], app_id="test-legacy", version=1)
    again = narrow.events(**SINCE, evaluated="true").json()["events"]
    assert {e["group_value"] for e in again} == {"ad-1"}
    assert narrow.delete("ads").status_code == 204
    assert "ads" in Client(base_url, TOKEN).rules()  # the admin's, untouched


@pytest.fixture(scope="module")
def hooks_client(base_url: str, lake: LakeSettings) -> Client:
    return _client(base_url, lake, "acme-hooks", "advertiser", "cmp-1")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/api/v2/dags",
        "http://localhost:9092",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "gopher://hooks.example/",
        "http://user:password@hooks.example/",
    ],
)
def test_a_webhook_that_may_not_be_reached_is_refused_naming_it(
    hooks_client: Client, url: str
) -> None:
    acme = hooks_client
    answer = acme.create(
        name="hook", where={"dimension": "campaign_id", "value": "cmp-1"}, webhook_url=url
    )
    _refused(answer, 400, "webhook_url")
    assert "hook" not in acme.rules()


def test_a_resolved_alert_is_no_longer_open(
    base_url: str, lake: LakeSettings, fired: dict[str, Any]
) -> None:
    admin = Client(base_url, TOKEN)
    resolved = {**_row(fired), "event": "resolved", "at": END + 5 * MINUTE}
    resolved["owner"] = "API_TOKEN"
    resolved["window_end"] = END + 5 * MINUTE
    store.append_events(lake, [resolved], app_id="test-resolve", version=1)
    after = admin.events(**SINCE).json()
    assert [e["event"] for e in after["events"] if e["rule"] == "ads"] == ["resolved", "fired"]
    assert after["open"] == []
    assert not any(e["open"] for e in after["events"])
    # A deleted rule's alerts are no longer listed.
    assert admin.delete("ads").status_code == 204
    assert admin.events(**SINCE).json()["events"] == []


def _time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _row(event: dict[str, Any]) -> dict[str, object]:
    """An alerts/events row of an answer's event."""
    row: dict[str, object] = {k: v for k, v in event.items() if k != "open"}
    for name in ("window_start", "window_end", "at"):
        row[name] = _time(event[name])
    return row
