"""API keys (access, `ctr keys`) on real Delta tables: a key verifies until it expires or is
revoked, only its hash is stored, a revoke by another process reaches a watcher at its next call,
last uses are committed in the background."""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from access import key_usage
from access.key_ring import ApiKey, KeyRing, hash_key
from access.key_store import KeyStoreError, create_key, read_keys, record_use, revoke_key
from access.key_usage import UsageRecorder
from access.key_watcher import KeyWatcher
from access.roles import Access, Scope
from cli.main import app
from lake import maintenance
from lake.catalog import API_KEYS, MAINTAINED, SERVED
from lake.maintenance import compact_and_vacuum, fold_key_uses
from lake.settings import LakeSettings
from lake.storage import open_delta
from tests.support.lake_writer import ctr_row, write_speed
from tests.support.waiting import wait_until

CTR = str(Path(sys.executable).with_name("ctr"))
T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
runner = CliRunner()


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def created(name: str, key: str, when: dt.datetime, **row: object) -> dict[str, object]:
    return {
        "name": name,
        "event": "created",
        "role": "analyst",
        "campaigns": [],
        "ads": [],
        "key_hash": hash_key(key),
        "expires_at": None,
        "at": when,
        **row,
    }


def event(name: str, kind: str, when: dt.datetime) -> dict[str, object]:
    return {"name": name, "event": kind, "at": when}


def named(ring: KeyRing, name: str) -> ApiKey:
    found = ring.get(name)
    assert found is not None, name
    return found


@pytest.fixture
def lake(lake: LakeSettings) -> LakeSettings:
    """A lake whose views have rows of campaigns c1 to c3 (ads a1, a2, a9) this minute: the
    ids the keys here name exist."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    write_speed(
        lake,
        [
            ctr_row(now, 5, 1, campaign=campaign, ad=ad)
            for campaign, ad in (("c1", "a1"), ("c2", "a2"), ("c2", "a9"), ("c3", "a1"))
        ],
    )
    return lake


def env(lake: LakeSettings) -> dict[str, str]:
    return {"LAKE_ROOT": str(lake.lake_root), "COLUMNS": "200"}


# The ring: pure, from rows.


def test_a_key_verifies_until_the_moment_it_expires() -> None:
    ring = KeyRing.from_rows([created("bi", "ctr_a", at(0), expires_at=at(60))])
    assert ring.verify("ctr_a", at(59.99)) == ApiKey(
        "bi", "analyst", None, hash_key("ctr_a"), at(0), expires_at=at(60)
    )
    assert ring.verify("ctr_a", at(60)) is None
    assert ring.verify("ctr_b", at(1)) is None
    assert named(ring, "bi").status(at(60)) == "expired"


def test_a_revoked_name_gets_a_new_key_and_the_old_one_stays_refused() -> None:
    rows = [
        created("bi", "ctr_old", at(0)),
        event("bi", "used", at(1)),
        event("bi", "revoked", at(2)),
        event("bi", "used", at(2.5)),  # after the revoke: no use of any key
        created("bi", "ctr_new", at(3), role="advertiser", campaigns=["c1"], ads=["a1"]),
        event("bi", "used", at(5)),
        event("bi", "used", at(4)),
    ]
    random.Random(7).shuffle(rows)  # the table's rows come in no order: events go by time
    ring = KeyRing.from_rows(rows)
    assert ring.verify("ctr_old", at(4)) is None
    new = ring.verify("ctr_new", at(4))
    assert new == ApiKey(
        "bi", "advertiser", Scope(("c1",), ("a1",)), hash_key("ctr_new"), at(3), last_used_at=at(5)
    )
    assert new.access == Access("bi", "advertiser", Scope(("c1",), ("a1",)))
    assert [k.name for k in ring.keys] == ["bi"]


def test_a_revoke_at_the_microsecond_of_creation_revokes_and_racing_creates_keep_the_first() -> (
    None
):
    ring = KeyRing.from_rows(
        [
            event("a", "revoked", at(0)),
            created("a", "ctr_a", at(0)),
            created("b", "ctr_b1", at(1)),
            created("b", "ctr_b2", at(2)),  # over a key not revoked: two creates raced
        ]
    )
    assert named(ring, "a").status(at(1)) == "revoked"
    assert ring.verify("ctr_a", at(1)) is None
    assert ring.verify("ctr_b1", at(3)) is not None
    assert ring.verify("ctr_b2", at(3)) is None


# The store: real Delta tables.


def test_the_keys_table_is_maintained_and_never_served() -> None:
    assert API_KEYS in MAINTAINED
    assert API_KEYS not in SERVED


def test_the_maintenance_dag_compacts_the_keys_and_a_watcher_keeps_them(
    lake: LakeSettings,
) -> None:
    issued = [create_key(lake, name, "analyst")[1] for name in ("a", "b", "c")]
    watcher = KeyWatcher(lake)
    before = watcher.ring().keys
    report = compact_and_vacuum(lake, API_KEYS.name, retention_hours=0)
    assert report is not None
    assert (report.files_removed, report.files_added, report.files_vacuumed) == (3, 1, 3)
    assert watcher.ring().keys == before
    assert watcher.reloads == 2  # the compaction is a commit: read again, the same keys
    now = dt.datetime.now(dt.UTC)
    assert all(watcher.ring().verify(s, now) is not None for s in issued)


def test_maintenance_keeps_only_each_keys_newest_use(lake: LakeSettings) -> None:
    _, secret = create_key(lake, "busy", "analyst")
    create_key(lake, "idle", "analyst")
    start = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)  # after the keys' creation
    for minute in range(5):  # an API process's flushes, a minute apart
        record_use(lake, {"busy": start + dt.timedelta(minutes=minute)})
    before = read_keys(lake)
    report = compact_and_vacuum(lake, API_KEYS.name, retention_hours=0)
    assert report is not None
    events = open_delta(API_KEYS.path(lake), lake.object_store).to_pyarrow_table()
    assert sorted(zip(events["name"].to_pylist(), events["event"].to_pylist(), strict=True)) == [
        ("busy", "created"),
        ("busy", "used"),
        ("idle", "created"),
    ]
    after = read_keys(lake)
    assert after.keys == before.keys
    assert after.get("busy").last_used_at == start + dt.timedelta(minutes=4)  # type: ignore[union-attr]
    assert after.verify(secret, dt.datetime.now(dt.UTC)) is not None
    # Nothing superseded: no commit.
    version = open_delta(API_KEYS.path(lake), lake.object_store).version()
    assert fold_key_uses(lake) == 0
    assert open_delta(API_KEYS.path(lake), lake.object_store).version() == version


def test_a_revoke_committed_while_uses_are_folded_stays(
    lake: LakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, secret = create_key(lake, "leaver", "advertiser", campaigns=["c1"])
    used = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)  # after the key's creation
    record_use(lake, {"leaver": used})
    record_use(lake, {"leaver": used + dt.timedelta(minutes=1)})
    read = maintenance.open_delta  # type: ignore[attr-defined]

    revoked: list[bool] = []

    def read_then_revoke(path: str, *args: object, **kwargs: object) -> object:
        table = read(path, *args, **kwargs)  # type: ignore[arg-type]
        if not revoked:  # another process, between the fold's read and its commit
            revoked.append(True)
            revoke_key(lake, "leaver")
        return table

    monkeypatch.setattr(maintenance, "open_delta", read_then_revoke)
    assert fold_key_uses(lake) == 1
    monkeypatch.undo()
    assert read_keys(lake).verify(secret, dt.datetime.now(dt.UTC)) is None
    assert read_keys(lake).get("leaver").status(dt.datetime.now(dt.UTC)) == "revoked"  # type: ignore[union-attr]


def test_a_created_key_verifies_and_only_its_hash_is_stored(lake: LakeSettings) -> None:
    key, secret = create_key(lake, "acme@reports", "advertiser", campaigns=["c2", "c1", "c1"])
    assert secret.startswith("ctr_")
    assert len(secret) > 40
    assert key.key_hash == hash_key(secret)
    assert key.scope == Scope(("c1", "c2"))
    assert read_keys(lake).verify(secret, dt.datetime.now(dt.UTC)) == key
    stored = [p.read_bytes() for p in Path(API_KEYS.path(lake)).rglob("*") if p.is_file()]
    assert len(stored) >= 2  # a log entry and a data file
    assert not any(secret.encode() in data or secret[4:].encode() in data for data in stored)
    assert open_delta(API_KEYS.path(lake), lake.object_store).to_pyarrow_table().column(
        "key_hash"
    ).to_pylist() == [hash_key(secret)]


def test_revoke_expiry_and_a_new_key_for_the_name(lake: LakeSettings) -> None:
    now = dt.datetime.now(dt.UTC)
    _, first = create_key(lake, "bi", "analyst", expires_at=now + dt.timedelta(hours=1))
    assert read_keys(lake).verify(first, now) is not None
    assert read_keys(lake).verify(first, now + dt.timedelta(hours=1)) is None
    revoked = revoke_key(lake, "bi", reason="rotated")
    assert revoked.revoked_at is not None
    assert read_keys(lake).verify(first, now) is None
    with pytest.raises(KeyStoreError, match="name: the key named 'bi' was revoked already"):
        revoke_key(lake, "bi")
    key, second = create_key(lake, "bi", "admin")
    ring = read_keys(lake)  # a new reader of the same lake
    assert (ring.verify(first, key.created_at), ring.verify(second, key.created_at)) == (None, key)


@pytest.mark.parametrize(
    ("name", "role", "options", "message"),
    [
        ("bi", "analyst", {}, "name: 'bi' has a key already \\(active, created .*\\); revoke it"),
        ("new key", "analyst", {}, "name: 1 to 64 letters, digits"),
        ("x" * 65, "analyst", {}, "name: 1 to 64"),
        ("acme", "owner", {}, "role: one of admin, analyst, advertiser, got 'owner'"),
        ("acme", "advertiser", {"ads": ["a1"]}, "campaigns: .*at least one campaign id"),
        ("acme", "analyst", {"campaigns": ["c1"]}, "campaigns: only an advertiser key"),
        ("acme", "admin", {"ads": ["a1"]}, "ads: only an advertiser key"),
        ("acme", "advertiser", {"campaigns": "c1"}, "campaigns: a sequence of ids, not"),
        ("acme", "advertiser", {"campaigns": ["c1", ""]}, "campaigns: '': must not be empty"),
        ("acme", "analyst", {"expires_at": at(0)}, "expires_at: must be in the future"),
        ("acme", "analyst", {"expires_at": dt.datetime(2099, 1, 1)}, "expires_at: a datetime wi"),
    ],
)
def test_a_key_that_cannot_be_is_refused_naming_the_argument(
    lake: LakeSettings, name: str, role: str, options: dict[str, object], message: str
) -> None:
    create_key(lake, "bi", "analyst")
    with pytest.raises(KeyStoreError, match=message):
        create_key(lake, name, role, **options)  # type: ignore[arg-type]
    assert [k.name for k in read_keys(lake).keys] == ["bi"]


def test_revoking_an_unknown_name_is_refused(lake: LakeSettings) -> None:
    with pytest.raises(KeyStoreError, match="name: no key is named 'ghost'"):
        revoke_key(lake, "ghost")


# The watcher: one stat per call, a reload per commit.


def test_the_watcher_reads_again_only_after_a_commit(lake: LakeSettings) -> None:
    watcher = KeyWatcher(lake)
    assert not watcher.check_is_remote
    assert watcher.ring().keys == ()
    assert watcher.ring().keys == ()  # no table yet, and still none: not read again
    assert watcher.reloads == 1
    _, secret = create_key(lake, "bi", "analyst")
    now = dt.datetime.now(dt.UTC)
    for _ in range(3):
        assert watcher.ring().verify(secret, now) is not None
    assert watcher.reloads == 2
    revoke_key(lake, "bi")
    assert watcher.ring().verify(secret, now) is None
    assert watcher.reloads == 3
    assert KeyWatcher(lake).ring().keys == watcher.ring().keys  # durable


def test_a_revoke_by_ctr_keys_in_another_process_reaches_the_watcher_at_its_next_call(
    lake: LakeSettings,
) -> None:
    _, secret = create_key(lake, "bi", "analyst")
    watcher = KeyWatcher(lake)
    now = dt.datetime.now(dt.UTC)
    assert watcher.ring().verify(secret, now) is not None
    revoked = subprocess.run(
        [CTR, "keys", "revoke", "bi", "--reason", "leaked"],
        env={**os.environ, **env(lake)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert revoked.returncode == 0, revoked.stderr
    assert "the API refuses it from its next request" in revoked.stderr
    assert watcher.ring().verify(secret, now) is None
    assert watcher.reloads == 2


def test_a_watcher_reads_again_past_its_max_age(lake: LakeSettings) -> None:
    """The log file the stat looks for is cleaned up after LAKE_HISTORY_RETENTION_HOURS: a
    ring too old is read again whatever the stat says."""
    create_key(lake, "bi", "analyst")
    now = [0.0]
    watcher = KeyWatcher(lake, max_age_s=0.05, clock=lambda: now[0])
    watcher.ring()
    watcher.ring()
    assert watcher.reloads == 1
    now[0] += 0.06
    watcher.ring()
    assert watcher.reloads == 2


def test_a_watcher_looks_for_new_commits_at_most_every_check_interval(
    lake: LakeSettings,
) -> None:
    """API_KEYS_CHECK_S: one look per interval however many requests; a revoke is seen at the
    first look after it."""
    _, secret = create_key(lake, "bi", "analyst")
    now = [0.0]
    watcher = KeyWatcher(lake, check_every_s=0.5, clock=lambda: now[0])
    watcher.ring()
    for _ in range(10):
        watcher.ring()
    assert watcher.checks == 1
    revoke_key(lake, "bi")
    assert watcher.ring().verify(secret, dt.datetime.now(dt.UTC)) is not None  # not looked yet
    now[0] += 0.5
    assert watcher.ring().verify(secret, dt.datetime.now(dt.UTC)) is None
    assert (watcher.checks, watcher.reloads) == (2, 2)
    # A key created since the last look: found when asked to look now (at most every 0.1 s).
    _, created = create_key(lake, "new", "analyst")
    now[0] += 0.2
    assert watcher.ring().verify(created, dt.datetime.now(dt.UTC)) is None
    assert watcher.ring(look_now=True).verify(created, dt.datetime.now(dt.UTC)) is not None
    assert watcher.ring(look_now=True).verify(created, dt.datetime.now(dt.UTC)) is not None
    assert watcher.checks == 3


# Last uses.


def test_last_uses_are_committed_by_close_the_latest_per_key(lake: LakeSettings) -> None:
    create_key(lake, "a", "analyst", now=at(0))
    create_key(lake, "b", "admin", now=at(0))
    recorder = UsageRecorder(lake, flush_s=3600)
    recorder.touch("a", at(2))
    recorder.touch("a", at(1))
    recorder.touch("b", at(3))
    version = open_delta(API_KEYS.path(lake), lake.object_store).version()
    recorder.close()
    assert [(k.name, k.last_used_at) for k in read_keys(lake).keys] == [("a", at(2)), ("b", at(3))]
    assert open_delta(API_KEYS.path(lake), lake.object_store).version() == version + 1  # one commit
    record_use(lake, {})  # nothing used: no commit
    assert open_delta(API_KEYS.path(lake), lake.object_store).version() == version + 1


def test_a_failed_flush_keeps_its_uses_for_the_next_one(
    lake: LakeSettings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    create_key(lake, "a", "analyst", now=at(0))
    attempts: list[int] = []

    def store_down_once(lake_: LakeSettings, used: dict[str, dt.datetime]) -> None:
        attempts.append(len(used))
        if len(attempts) == 1:
            raise OSError("store unreachable")
        record_use(lake_, used)

    monkeypatch.setattr(key_usage, "record_use", store_down_once)
    recorder = UsageRecorder(lake, flush_s=3600)
    recorder.touch("a", at(1))
    with caplog.at_level(logging.ERROR, logger="ctr.keys"):
        recorder.flush()
    assert "next flush retries" in caplog.text
    assert named(read_keys(lake), "a").last_used_at is None
    recorder.touch("a", at(2))
    recorder.close()
    assert named(read_keys(lake), "a").last_used_at == at(2)


def test_the_background_thread_flushes_every_flush_s(lake: LakeSettings) -> None:
    create_key(lake, "a", "analyst", now=at(0))
    recorder = UsageRecorder(lake, flush_s=0.05)
    try:
        recorder.touch("a", at(1))
        wait_until(
            lambda: named(read_keys(lake), "a").last_used_at is not None,
            timeout_s=60,
            what="the background thread flushed the use",
        )
    finally:
        recorder.close()


# `ctr keys`.


def test_ctr_keys_create_prints_the_key_alone_on_the_last_line(lake: LakeSettings) -> None:
    args = "keys create acme --scope advertiser --campaign c1 --campaign c2 --ad a9 --expires 30d"
    result = runner.invoke(
        app,
        args.split(),
        env=env(lake),
    )
    assert result.exit_code == 0, result.output
    secret = result.stdout.splitlines()[-1]
    assert secret == result.stdout.strip()  # the key alone on stdout
    key = read_keys(lake).verify(secret, dt.datetime.now(dt.UTC))
    assert key is not None
    assert key.scope == Scope(("c1", "c2"), ("a9",))
    assert key.expires_at is not None
    assert key.expires_at - key.created_at == dt.timedelta(days=30)
    assert "created key 'acme': advertiser, campaigns c1, c2; ads a9; expires" in result.stderr
    assert "shown once" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["bi", "--scope", "analyst"], 1, "NAME: 'bi' has a key already"),
        (["acme", "--scope", "advertiser"], 1, "--campaign: an advertiser's scope needs"),
        (["acme", "--scope", "analyst", "--campaign", "c1"], 1, "--campaign: only an advertiser"),
        (["acme", "--scope", "owner"], 2, "'owner' is not a scope; choose one of admin, analyst"),
        (["acme", "--scope", "advertizer"], 2, "--scope: 'advertizer' is not a scope"),
        (["acme", "--scope", "admin", "--expires", "soon"], 2, "--expires"),
        (["acme", "--scope", "admin", "--expires", "2020-01-01"], 1, "--expires: must be in"),
    ],
)
def test_ctr_keys_create_errors_say_which_option(
    lake: LakeSettings, args: list[str], code: int, message: str
) -> None:
    create_key(lake, "bi", "analyst")
    result = runner.invoke(app, ["keys", "create", *args], env=env(lake))
    assert result.exit_code == code, result.output
    assert message in result.output
    assert result.stdout == ""


def test_ctr_keys_list_shows_active_keys_or_all_never_a_hash(lake: LakeSettings) -> None:
    hashes = [create_key(lake, name, "analyst")[0].key_hash for name in ("keep", "gone")]
    revoke_key(lake, "gone")
    active = runner.invoke(app, ["keys", "list"], env=env(lake))
    every = runner.invoke(app, ["keys", "list", "--all"], env=env(lake))
    assert (active.exit_code, every.exit_code) == (0, 0)
    assert "keep" in active.output
    assert "gone" not in active.output
    assert "gone" in every.output
    assert "revoked" in every.output
    for output in (active.output, every.output):
        assert not any(h[:16] in output for h in hashes)
    missing = runner.invoke(app, ["keys", "revoke", "ghost"], env=env(lake))
    assert missing.exit_code == 1
    assert "NAME: no key is named 'ghost'" in missing.output


def test_ctr_keys_help_says_what_each_scope_sees() -> None:
    result = runner.invoke(app, ["keys", "create", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "keys create [OPTIONS] {NAME}" in result.output  # not {name}
    assert "admin|analyst|advertiser" in result.output
    for words in ("--scope", "--campaign", "--expires", "raw events", "/metrics", "shown"):
        assert words in result.output


# Issue 55: scopes of ids that exist, kept exactly as the events carry them.


def test_a_scope_names_campaigns_and_ads_the_lake_has(lake: LakeSettings) -> None:
    with pytest.raises(KeyStoreError, match=r"campaigns: no campaign 'c7' in the views' rows of"):
        create_key(lake, "acme", "advertiser", campaigns=["c1", "c7"])
    with pytest.raises(KeyStoreError, match=r"--allow-unknown"):
        create_key(lake, "acme", "advertiser", campaigns=["cmp-001"])
    # An ad of another campaign is not the scope's.
    with pytest.raises(KeyStoreError, match=r"ads: no ad of the key's campaigns 'a2'"):
        create_key(lake, "acme", "advertiser", campaigns=["c1"], ads=["a1", "a2"])
    created, _ = create_key(lake, "acme", "advertiser", campaigns=["c2"], ads=["a2", "a9"])
    assert created.scope == Scope(("c2",), ("a2", "a9"))
    # A campaign that has not started yet: said so explicitly.
    later, _ = create_key(lake, "launch", "advertiser", campaigns=["c7"], allow_unknown=True)
    assert later.scope == Scope(("c7",))


def test_scope_ids_are_kept_exactly_as_the_events_carry_them(lake: LakeSettings) -> None:
    """Before, spaces were stripped: ' c1' became c1, a campaign the events never name."""
    with pytest.raises(KeyStoreError, match=r"no campaign ' c1' in"):
        create_key(lake, "acme", "advertiser", campaigns=[" c1"])
    spaced, _ = create_key(lake, "acme", "advertiser", campaigns=[" c1 "], allow_unknown=True)
    assert spaced.scope == Scope((" c1 ",))
    assert read_keys(lake).keys[0].scope == Scope((" c1 ",))


@pytest.mark.parametrize(
    ("campaign", "message"),
    [
        ("c" * 100_000, r"'cccc.*… \(100,000 characters\): 100000 characters exceeds the limit"),
        ("c1\u200b", r"'c1\\u200b': contains U\+200B ZERO WIDTH SPACE"),
        ("c1\u202e", r"'c1\\u202e': contains U\+202E RIGHT-TO-LEFT OVERRIDE"),
        ("c1\n", r"'c1\\n': contains U\+000A"),
    ],
    ids=["100000-characters", "zero-width", "bidi-override", "newline"],
)
def test_a_scope_id_the_event_contract_refuses_is_refused(
    lake: LakeSettings, campaign: str, message: str
) -> None:
    with pytest.raises(KeyStoreError, match=f"campaigns: {message}"):
        create_key(lake, "acme", "advertiser", campaigns=[campaign], allow_unknown=True)
    assert read_keys(lake).keys == ()


def test_ctr_keys_create_refuses_unknown_campaigns_unless_told(lake: LakeSettings) -> None:
    refused = runner.invoke(
        app, ["keys", "create", "acme", "--scope", "advertiser", "--campaign", "c9"], env=env(lake)
    )
    assert refused.exit_code == 1
    assert "--campaign: no campaign 'c9' in the views' rows of the last 30 days" in refused.stderr
    assert "--allow-unknown" in refused.stderr
    allowed = runner.invoke(
        app,
        ["keys", "create", "acme", "--scope", "advertiser", "--campaign", "c9", "--allow-unknown"],
        env=env(lake),
    )
    assert allowed.exit_code == 0, allowed.output
    assert read_keys(lake).get("acme") is not None
