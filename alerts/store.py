"""alerts/rules: the alert rules, an append-only Delta table of events (``created``,
``deleted``), like the key store (:mod:`access.key_store`); and alerts/events, what the
evaluator found, appended by its one process. Both through delta-rs, on a local lake or on an
object store; neither is served to SQL (a rule holds its webhook's secret).

A rule is named within its owner's rules (the key that made it: ``Rule.id`` is
``owner/name``); who sees which rule and which of its alerts is :func:`visible` and
:func:`admits_group`."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import orjson
import pyarrow as pa

from access.roles import Access, Scope
from alerts.destinations import Resolver, UnresolvedError, system_resolver
from alerts.rules import Rule, RuleError
from alerts.settings import AlertSettings
from lake.catalog import ALERT_EVENTS, ALERT_RULES
from lake.settings import LakeSettings
from lake.storage import delta_options, is_delta, open_delta

if TYPE_CHECKING:
    from deltalake import CommitProperties

_TICK: Final = dt.timedelta(microseconds=1)


def rule_json(rule: Rule) -> str:
    """The rule's fields as stored (its scope as lists, its time ISO-8601)."""
    fields = dataclasses.asdict(rule)
    fields["scope"] = (
        {"campaigns": list(rule.scope.campaigns), "ads": list(rule.scope.ads)}
        if rule.scope
        else None
    )
    fields["created_at"] = rule.created_at.isoformat() if rule.created_at else None
    return orjson.dumps(fields).decode()


def rule_from_json(text: str) -> Rule:
    fields = orjson.loads(text)
    scope = fields.pop("scope")
    created = fields.pop("created_at")
    where = fields.pop("where")
    return Rule(
        **fields,
        where=tuple(where) if where else None,
        scope=Scope(tuple(scope["campaigns"]), tuple(scope["ads"])) if scope else None,
        created_at=dt.datetime.fromisoformat(created) if created else None,
    )


# The owner of the rules made on the command line (no key).
COMMAND_LINE: Final = "ctr"


def owner_of(access: Access | None) -> str:
    return access.name if access is not None else COMMAND_LINE


def read_rules(lake: LakeSettings) -> dict[str, Rule]:
    """The rules as they are now, by :attr:`Rule.id` (none before the first is created)."""
    path = ALERT_RULES.path(lake)
    if not is_delta(path, lake.object_store):
        return {}
    rows = open_delta(path, lake.object_store).to_pyarrow_table().to_pylist()
    rules: dict[str, Rule] = {}
    for row in sorted(rows, key=lambda r: r["at"]):
        if row["event"] == "created":
            rule = rule_from_json(row["rule"])
            rules[rule.id] = rule
        elif row["event"] == "deleted" and row["rule"] is not None:
            rules.pop(f"{row['owner']}/{row['name']}", None)
        elif row["event"] == "deleted":  # before names were per owner: the name was global
            rules = {i: r for i, r in rules.items() if r.name != row["name"]}
    return rules


def find_rule(
    rules: Mapping[str, Rule], name: str, owner: str | None = None
) -> tuple[Rule | None, list[str]]:
    """The rule ``name`` of ``owner``; without an owner, the only rule of that name. With the
    owners of every rule so named (to say which to choose between)."""
    named = [r for r in rules.values() if r.name == name]
    owners = sorted(r.owner for r in named)
    if owner is not None:
        return rules.get(f"{owner}/{name}"), owners
    return (named[0] if len(named) == 1 else None), owners


def visible(rules: Mapping[str, Rule], access: Access | None) -> dict[str, Rule]:
    """The rules ``access`` sees: every one for an admin or analyst key (None: the command
    line's); an advertiser's, those whose rows lie inside its scope (a rule on one of its
    campaigns, or ads; for a key that names ads, a rule narrowed to those ads)."""
    if access is None or access.scope is None:
        return dict(rules)
    return {i: r for i, r in rules.items() if _inside(r, access.scope)}


def _inside(rule: Rule, scope: Scope) -> bool:
    """Whether every row ``rule`` may count is one ``scope`` admits."""
    dimension, value = rule.where if rule.where is not None else ("", "")
    campaigns: set[str] | None = {value} if dimension == "campaign_id" else None
    ads: set[str] | None = {value} if dimension == "ad_id" else None
    if rule.scope is not None:  # an advertiser's rule counts its scope's rows only
        campaigns = (campaigns or set(rule.scope.campaigns)) & set(rule.scope.campaigns)
        if rule.scope.ads:
            ads = (ads or set(rule.scope.ads)) & set(rule.scope.ads)
    if campaigns is None or not campaigns <= set(scope.campaigns):
        return False
    return not scope.ads or (ads is not None and ads <= set(scope.ads))


def admits_row(rule: Rule, row: Mapping[str, object], access: Access | None) -> bool:
    """Whether ``access`` may see ``row`` of alerts/events, a row of ``rule`` (one it sees): a
    group outside an advertiser's campaigns or ads is not its to see, whoever made the rule.
    For a key that names ads, neither is a row the evaluator wrote before rules were narrowed
    to their scope (no ``owner``): it may count other ads' rows."""
    scope = access.scope if access is not None else None
    if scope is None:
        return True
    if scope.ads and row.get("owner") is None:
        return False
    group = row.get("group_value")
    if group is None or rule.per not in ("campaign_id", "ad_id"):
        return True
    if rule.per == "campaign_id":
        return group in scope.campaigns
    return not scope.ads or group in scope.ads


def create_rule(
    lake: LakeSettings,
    rule: Rule,
    settings: AlertSettings,
    *,
    access: Access | None = None,
    now: dt.datetime | None = None,
    resolver: Resolver = system_resolver,
) -> Rule:
    """Store ``rule`` (one commit), with a new webhook secret and its owner: the rule as stored.
    Refused when its owner has a rule of that name or ``settings.max_rules_per_owner`` rules,
    an advertiser's rule watches another's campaign or ad, or its webhook points where webhooks
    may not (:meth:`alerts.destinations.WebhookPolicy.resolve`; a host name that does not
    resolve yet is taken: each delivery checks it again)."""
    at = now or dt.datetime.now(dt.UTC)
    owner = owner_of(access)
    stored = dataclasses.replace(
        rule,
        secret=secrets.token_urlsafe(32),
        owner=owner,
        scope=access.scope if access is not None else None,
        created_at=at,
    )
    stored.check()
    if stored.webhook_url is not None:
        # A name that does not resolve yet is taken: each delivery checks it again.
        with contextlib.suppress(UnresolvedError):
            settings.webhook_policy.resolve(stored.webhook_url, resolver)
    rules = read_rules(lake)
    if stored.id in rules:
        raise RuleError("name", f"a rule named {rule.name!r} exists; delete it first")
    if sum(r.owner == owner for r in rules.values()) >= settings.max_rules_per_owner:
        raise RuleError(
            "name",
            f"this key has {settings.max_rules_per_owner} rules, as many as a key may "
            "(ALERTS_MAX_RULES_PER_OWNER); delete one first",
        )
    campaign = rule.where[1] if rule.where and rule.where[0] == "campaign_id" else None
    _append(
        lake,
        ALERT_RULES.schema,
        ALERT_RULES.path(lake),
        [
            {
                "name": rule.name,
                "event": "created",
                "rule": rule_json(stored),
                "owner": owner,
                "campaign_id": campaign,
                "at": at,
            }
        ],
    )
    return stored


def delete_rule(
    lake: LakeSettings,
    name: str,
    *,
    owner: str | None = None,
    access: Access | None = None,
    now: dt.datetime | None = None,
) -> Rule:
    """Delete the rule ``name`` of ``owner`` (one commit). An advertiser deletes its own rules
    only (``owner`` is its key); an admin or analyst key any rule, its own by default; the
    command line any, by name alone while only one owner has a rule of that name."""
    if access is not None and (access.scope is not None or owner is None):
        if access.scope is not None and owner not in (None, access.name):
            raise RuleError("name", f"no rule is named {name!r}")
        owner = access.name
    current, owners = find_rule(read_rules(lake), name, owner)
    if current is None:
        if owner is None and len(owners) > 1:
            raise RuleError(
                "owner", f"{len(owners)} owners have a rule named {name!r}: {', '.join(owners)}"
            )
        raise RuleError("name", f"no rule is named {name!r}")
    at = max(now or dt.datetime.now(dt.UTC), (current.created_at or dt.datetime.min) + _TICK)
    row = {
        "name": name,
        "event": "deleted",
        "owner": current.owner,
        "rule": orjson.dumps({"deleted_by": owner_of(access)}).decode(),
        "at": at,
    }
    _append(lake, ALERT_RULES.schema, ALERT_RULES.path(lake), [row])
    return current


def append_events(
    lake: LakeSettings, rows: Sequence[Mapping[str, object]], *, app_id: str, version: int
) -> bool:
    """Append evaluator rows to alerts/events in one commit carrying the application
    transaction (``app_id``, ``version``): False, and nothing written, when the table holds that
    transaction already (a restart evaluating a window again)."""
    from deltalake import CommitProperties, Transaction

    path = ALERT_EVENTS.path(lake)
    if is_delta(path, lake.object_store):
        done = open_delta(path, lake.object_store).transaction_version(app_id)
        if done is not None and done >= version:
            return False
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)])
    _append(lake, ALERT_EVENTS.schema, path, rows, properties)
    return True


def last_version(lake: LakeSettings, app_id: str) -> int | None:
    """The last application-transaction version alerts/events holds for ``app_id``."""
    path = ALERT_EVENTS.path(lake)
    if not is_delta(path, lake.object_store):
        return None
    return open_delta(path, lake.object_store).transaction_version(app_id)


def read_events(
    lake: LakeSettings, *, since: dt.datetime, events: Iterable[str] = ()
) -> list[dict[str, object]]:
    """alerts/events rows whose window ended at or after ``since`` (of these kinds, if given),
    oldest first: a bounded read, by a filter delta-rs pushes to the files' statistics."""
    path = ALERT_EVENTS.path(lake)
    if not is_delta(path, lake.object_store):
        return []
    table = open_delta(path, lake.object_store)
    kinds = list(events)
    filters: list[tuple[str, str, object]] = [("window_end", ">=", since)]
    if kinds:
        filters.append(("event", "in", kinds))
    rows = table.to_pyarrow_table(filters=filters).to_pylist()
    return sorted(rows, key=lambda r: (r["at"], r["window_end"]))


def _append(
    lake: LakeSettings,
    schema: pa.Schema,
    path: str,
    rows: Sequence[Mapping[str, object]],
    properties: CommitProperties | None = None,
) -> None:
    from deltalake import write_deltalake

    data = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    options = delta_options(path, lake.object_store)
    # schema_mode="merge": a table written before a column was added takes it (null before).
    write_deltalake(
        path,
        data,
        mode="append",
        schema_mode="merge",
        storage_options=options,
        commit_properties=properties,
    )
