"""`ctr keys`: the API's keys — create, list, revoke."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Final, NoReturn

import typer

from access.roles import ROLES
from cli.console import console, fail
from cli.tables import Column, Json, Listing, Wide, minute, one_output, print_json, print_table

if TYPE_CHECKING:
    from access.key_ring import ApiKey
    from access.key_store import KeyStoreError

SCOPES: Final = (
    "admin: everything, the raw events (with user ids), rejected payloads and /metrics "
    "included; analyst: every campaign's views (CTR, coverage, drift, arrivals), no raw events; "
    "advertiser: only the rows of its campaigns (and of its ads, if any are named)"
)

app = typer.Typer(
    help="API keys: who may call the API, and what each key sees. "
    f"Scopes — {SCOPES}. A key is shown once, when it is created: the lake keeps only its "
    "SHA-256 (access/keys, which no query can read).",
    no_args_is_help=True,
)

Name = Annotated[
    str, typer.Argument(metavar="NAME", help="The key's name: 1 to 64 of A-Z a-z 0-9 . _ @ -.")
]
_RELATIVE: Final = re.compile(r"(\d+)([dh])")
# What each argument of access.key_store is called on this command line.
_OPTIONS: Final = {
    "name": "NAME",
    "role": "--scope",
    "campaigns": "--campaign",
    "ads": "--ad",
    "expires_at": "--expires",
    "allow_unknown": "--allow-unknown",
}


def _scope(value: str) -> str:
    """``--scope``'s value, checked as the command line is read (before anything runs)."""
    if value not in ROLES:
        raise typer.BadParameter(
            f"{value!r} is not a scope; choose one of {', '.join(ROLES)}", param_hint="--scope"
        )
    return value


@app.command()
def create(
    name: Name,
    scope: Annotated[
        str,
        typer.Option(
            metavar="|".join(ROLES), callback=_scope, help=f"What the key sees. {SCOPES}."
        ),
    ],
    campaign: Annotated[
        list[str] | None,
        typer.Option(help="A campaign id an advertiser key sees (repeat for several)."),
    ] = None,
    ad: Annotated[
        list[str] | None,
        typer.Option(
            help="An ad id: an advertiser key with ads sees only their rows (repeatable)."
        ),
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            help="When it stops working: in days or hours (30d, 12h) or at an ISO-8601 time "
            "(UTC unless it says otherwise). Default: never."
        ),
    ] = None,
    allow_unknown: Annotated[
        bool,
        typer.Option(
            "--allow-unknown",
            help="Accept campaign and ad ids the lake's views have no rows of in the last 30 "
            "days (a campaign that has not started yet). Default: such ids are refused, so a "
            "typo does not make a key that sees nothing.",
        ),
    ] = False,
) -> None:
    """Create a key for NAME and print it, alone on the last line of stdout (`| tail -1`). It
    is shown this once: only its SHA-256 is stored. A name has one key at a time: revoke it
    before creating another. An advertiser's ids are kept exactly as given (spaces too), as
    the events carry them."""
    from access.key_store import KeyStoreError, create_key
    from lake.settings import LakeSettings

    now = dt.datetime.now(dt.UTC)
    try:
        created, key = create_key(
            LakeSettings(),
            name,
            scope,
            campaigns=campaign or (),
            ads=ad or (),
            expires_at=_expiry(expires, now),
            now=now,
            allow_unknown=allow_unknown,
        )
    except KeyStoreError as exc:
        _fail(exc)
    expiry = (
        "never expires" if created.expires_at is None else f"expires {_time(created.expires_at)}"
    )
    console.print(f"created key {created.name!r}: {_grants(created)}; {expiry}", highlight=False)
    console.print(
        "The key is shown once, below; only its SHA-256 is stored, so it cannot be shown again.",
        highlight=False,
    )
    typer.echo(key)


@app.command("list")
def list_keys(
    every: Annotated[
        bool, typer.Option("--all", help="Revoked and expired keys too (default: active ones).")
    ] = False,
    wide: Wide = False,
    as_json: Json = False,
) -> None:
    """The keys: name, scope (campaigns and ads), when created and last used, status and
    expiry. Never a key or its hash."""
    from access.key_store import read_keys
    from lake.settings import LakeSettings

    one_output(as_json, wide)
    now = dt.datetime.now(dt.UTC)
    keys = [k for k in read_keys(LakeSettings()).keys if every or k.status(now) == "active"]
    if as_json:
        print_json({"keys": [key_record(k, now) for k in keys]})
    elif not keys:
        console.print(
            "no keys" if every else "no active keys (--all lists revoked and expired ones)"
        )
    else:
        print_table(keys_listing(keys, now), console, wide=wide)


def keys_listing(keys: Sequence[ApiKey], now: dt.datetime) -> Listing:
    """``ctr keys list``'s table."""
    listing = Listing(
        Column("name", whole=True),
        "scope",
        "created",
        "last used",
        "status",
        # The API records a key's last use once a minute (access.key_usage.UsageRecorder): a
        # key used seconds ago may still show none.
        caption="times in UTC; the API records last uses once a minute",
    )
    for key in keys:
        listing.add_row(
            key.name,
            _scope_cell(key),
            minute(key.created_at),
            "none recorded" if key.last_used_at is None else minute(key.last_used_at),
            _status_cell(key, now),
        )
    return listing


def key_record(key: ApiKey, now: dt.datetime) -> dict[str, object]:
    """A key as ``ctr keys list --json`` prints it (campaigns and ads None: every one)."""
    return {
        "name": key.name,
        "scope": key.role,
        "campaigns": None if key.scope is None else list(key.scope.campaigns),
        "ads": None if key.scope is None or not key.scope.ads else list(key.scope.ads),
        "created_at": key.created_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
        "last_used_at": key.last_used_at,
        "status": key.status(now),
    }


@app.command()
def revoke(
    name: Name,
    reason: Annotated[str, typer.Option(help="Why (recorded with the revoke).")] = "",
) -> None:
    """Revoke NAME's key: the API refuses it from its next request on (every API process
    checks the lake's keys for a new commit on each request)."""
    from access.key_store import KeyStoreError, revoke_key
    from lake.settings import LakeSettings

    try:
        revoked = revoke_key(LakeSettings(), name, reason=reason)
    except KeyStoreError as exc:
        _fail(exc)
    assert revoked.revoked_at is not None
    console.print(
        f"revoked key {name!r} at {_time(revoked.revoked_at)}; the API refuses it from its next "
        "request",
        highlight=False,
    )


def _expiry(value: str | None, now: dt.datetime) -> dt.datetime | None:
    from batch_layer.interval import IntervalError, parse_time

    if value is None:
        return None
    relative = _RELATIVE.fullmatch(value.strip())
    if relative:
        count, unit = int(relative.group(1)), relative.group(2)
        return now + (dt.timedelta(days=count) if unit == "d" else dt.timedelta(hours=count))
    try:
        return parse_time(value, "expires")
    except IntervalError:
        raise typer.BadParameter(
            f"{value!r}: days or hours from now (30d, 12h) or an ISO-8601 time like "
            "2026-12-31T00:00:00Z",
            param_hint="--expires",
        ) from None


def _fail(exc: KeyStoreError) -> NoReturn:
    fail(f"{_OPTIONS.get(exc.parameter, exc.parameter)}: {exc.message}")


def _grants(key: ApiKey) -> str:
    return key.role if key.scope is None else f"{key.role}, {key.scope.describe()}"


def _scope_cell(key: ApiKey) -> str:
    if key.scope is None:
        return f"{key.role}: {'everything' if key.role == 'admin' else 'every campaign'}"
    ads = f"; ads {', '.join(key.scope.ads)}" if key.scope.ads else ""
    return f"{key.role}: {', '.join(key.scope.campaigns)}{ads}"


def _status_cell(key: ApiKey, now: dt.datetime) -> str:
    status = key.status(now)
    if status == "revoked" and key.revoked_at is not None:
        return f"revoked {minute(key.revoked_at)}"
    if key.expires_at is None:
        return f"{status}, never expires"
    until = "active until" if status == "active" else status
    return f"{until} {minute(key.expires_at)}"


def _time(moment: dt.datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"
