"""alerts/rules: the alert rules, an append-only Delta table of events (``created``,
``deleted``), like the key store (:mod:`access.key_store`); and alerts/events, what the
evaluator found, appended by its one process. Both through delta-rs, on a local lake or on an
object store; neither is served to SQL (a rule holds its webhook's secret)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import orjson
import pyarrow as pa

from access.roles import Access, Scope
from alerts.rules import Rule, RuleError
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


def read_rules(lake: LakeSettings) -> dict[str, Rule]:
    """The rules as they are now, by name (none before the first is created)."""
    path = ALERT_RULES.path(lake)
    if not is_delta(path, lake.object_store):
        return {}
    rows = open_delta(path, lake.object_store).to_pyarrow_table().to_pylist()
    rules: dict[str, Rule] = {}
    for row in sorted(rows, key=lambda r: r["at"]):
        if row["event"] == "created":
            rules[row["name"]] = rule_from_json(row["rule"])
        elif row["event"] == "deleted":
            rules.pop(row["name"], None)
    return rules


def visible(rules: Mapping[str, Rule], access: Access | None) -> dict[str, Rule]:
    """The rules ``access`` sees and manages: every one for an admin or analyst key (None: the
    command line's), an advertiser's only those on its own campaigns (or ads)."""
    if access is None or access.scope is None:
        return dict(rules)
    scope = access.scope
    return {
        name: rule
        for name, rule in rules.items()
        if rule.where is not None
        and rule.where[1] in (scope.campaigns if rule.where[0] == "campaign_id" else scope.ads)
    }


def create_rule(
    lake: LakeSettings, rule: Rule, *, access: Access | None = None, now: dt.datetime | None = None
) -> Rule:
    """Store ``rule`` (one commit), with a new webhook secret and its owner: the rule as stored.
    Refused when a rule of that name exists, or an advertiser's rule watches another's
    campaign."""
    at = now or dt.datetime.now(dt.UTC)
    owner = access.name if access is not None else "ctr"
    stored = dataclasses.replace(
        rule,
        secret=secrets.token_urlsafe(32),
        owner=owner,
        scope=access.scope if access is not None else None,
        created_at=at,
    )
    stored.check()
    if rule.name in read_rules(lake):
        raise RuleError("name", f"a rule named {rule.name!r} exists; delete it first")
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
    lake: LakeSettings, name: str, *, access: Access | None = None, now: dt.datetime | None = None
) -> Rule:
    """Delete the rule ``name`` (one commit); an advertiser only its own campaigns' rules."""
    current = visible(read_rules(lake), access).get(name)
    if current is None:
        raise RuleError("name", f"no rule is named {name!r}")
    at = max(now or dt.datetime.now(dt.UTC), (current.created_at or dt.datetime.min) + _TICK)
    owner = access.name if access is not None else "ctr"
    row = {"name": name, "event": "deleted", "owner": owner, "at": at}
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
    write_deltalake(
        path, data, mode="append", storage_options=options, commit_properties=properties
    )
