"""/api/v1/alerts: the CTR alert rules the key sees (list, create, delete) and their recent
alerts (:mod:`alerts`). An admin or analyst key sees and manages every rule; an advertiser's
sees the rules whose rows lie inside its scope and the alerts of their groups inside it, and
deletes its own. Rule names are per owner (the key). Read from the lake on each request
(alerts/rules and alerts/events are small); never a rule's webhook secret, but once, in the
answer that created it, nor another key's webhook URL to an advertiser."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Final

from fastapi import APIRouter, Path, Query, Response, status

from access.roles import Access
from alerts import store
from alerts.rules import Rule, RuleError
from api.deps import AccessDep, AlertSettingsDep, LakeDep
from api.errors import NotFoundError, ParameterError
from api.models import (
    AlertEventBody,
    AlertEventsResponse,
    AlertRuleBody,
    AlertRuleCreated,
    AlertRuleRequest,
    AlertRulesResponse,
    ErrorResponse,
)
from api.times import as_utc
from lake.settings import LakeSettings

router = APIRouter(prefix="/api/v1", tags=["alerts"])

# An alert's transitions and its webhook's failure; `evaluated=true` adds the evaluations.
TRANSITIONS: Final = ("fired", "resolved", "confirmed", "withdrawn", "dead_letter")
# What opens and closes an alert.
OPENING: Final = ("fired", "resolved", "withdrawn")
# How far before `since` an alert still open may have fired.
OPEN_HORIZON: Final = dt.timedelta(hours=24)
DEFAULT_SINCE: Final = dt.timedelta(hours=24)
MAX_LIMIT: Final = 1000
Key = tuple[str, str | None]  # a rule's id (owner/name) and group


def _rule_body(rule: Rule, access: Access | None = None) -> dict[str, object]:
    """The rule as a key sees it: an advertiser sees another key's rule without its webhook."""
    own = access is None or access.scope is None or rule.owner == access.name
    where = {"dimension": rule.where[0], "value": rule.where[1]} if rule.where else None
    return {
        "name": rule.name,
        "description": rule.describe(),
        "measure": rule.measure,
        "where": where,
        "per": rule.per,
        "window_minutes": rule.window_minutes,
        "baseline": rule.baseline,
        "baseline_days": rule.baseline_days,
        "baseline_minutes": rule.baseline_minutes,
        "alpha": rule.alpha,
        "min_effect": rule.min_effect,
        "direction": rule.direction,
        "min_trials": rule.min_trials,
        "webhook_url": rule.webhook_url if own else None,
        "owner": rule.owner,
        "created_at": rule.created_at,
    }


@router.get(
    "/alerts",
    response_model=AlertRulesResponse,
    responses={401: {"model": ErrorResponse}},
    summary="The alert rules the key sees (never their webhook secrets)",
)
def list_alert_rules(lake: LakeDep, access: AccessDep) -> AlertRulesResponse:
    rules = store.visible(store.read_rules(lake), access)
    return AlertRulesResponse(
        rules=[
            AlertRuleBody.model_validate(_rule_body(r, access)) for _, r in sorted(rules.items())
        ]
    )


@router.post(
    "/alerts",
    response_model=AlertRuleCreated,
    status_code=status.HTTP_201_CREATED,
    responses={
        400: {
            "model": ErrorResponse,
            "description": "a bad field (named in parameter), a name the key uses already, "
            "as many rules as a key may have, a webhook that may not be reached (not a public "
            "address, nor allowed), or (an advertiser key) a rule on rows outside its scope",
        },
        401: {"model": ErrorResponse},
    },
    summary="Create an alert rule; its webhook secret is in this answer only",
)
def create_alert_rule(
    body: AlertRuleRequest, lake: LakeDep, access: AccessDep, settings: AlertSettingsDep
) -> AlertRuleCreated:
    fields = body.model_dump()
    where = body.where
    fields["where"] = (where.dimension, where.value) if where is not None else None
    try:
        rule = Rule.create(**fields)
        stored = store.create_rule(lake, rule, settings, access=access)
    except RuleError as exc:
        raise ParameterError(exc.parameter, exc.message) from None
    return AlertRuleCreated.model_validate({**_rule_body(stored), "secret": stored.secret})


@router.delete(
    "/alerts/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={
        401: {"model": ErrorResponse},
        404: {
            "model": ErrorResponse,
            "description": "no rule of that name and owner the key may delete",
        },
    },
    summary="Delete an alert rule (its past alerts stay in alerts/events)",
)
def delete_alert_rule(
    name: Annotated[str, Path(description="the rule's name")],
    lake: LakeDep,
    access: AccessDep,
    owner: Annotated[
        str | None,
        Query(
            description="the rule's owner (an admin or analyst key deleting another key's "
            "rule); default: the key itself. An advertiser key deletes its own rules only"
        ),
    ] = None,
) -> Response:
    try:
        store.delete_rule(lake, name, owner=owner, access=access)
    except RuleError as exc:  # not a rule this key may delete
        raise NotFoundError("name", exc.message) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/alerts/events",
    response_model=AlertEventsResponse,
    responses={
        400: {"model": ErrorResponse, "description": "a bad parameter"},
        401: {"model": ErrorResponse},
    },
    summary="Recent alerts of the rules the key sees, newest first, and those open now",
)
def get_alert_events(
    lake: LakeDep,
    access: AccessDep,
    since: Annotated[
        dt.datetime | None,
        Query(
            description="ISO-8601, no offset = UTC: the rows whose window ended at or after "
            "it; default: 24 h ago"
        ),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_LIMIT, description=f"rows at most (1 to {MAX_LIMIT})")
    ] = 100,
    evaluated: Annotated[
        bool,
        Query(description="also the per-minute evaluations (one row per rule, group, minute)"),
    ] = False,
) -> AlertEventsResponse:
    start = as_utc(since, "since") if since is not None else dt.datetime.now(dt.UTC) - DEFAULT_SINCE
    rules = store.visible(store.read_rules(lake), access)
    kinds = (*TRANSITIONS, "evaluated") if evaluated else TRANSITIONS
    rows = _of(store.read_events(lake, since=start, events=kinds), rules, access)
    opened = open_alerts(_of(_history(lake, start), rules, access))
    newest = sorted(rows, key=lambda r: (r["at"], r["window_end"]), reverse=True)
    return AlertEventsResponse(
        events=[_event(r, opened) for r in newest[:limit]],
        open=[_event(r, opened) for r in sorted(opened.values(), key=_newest, reverse=True)],
        truncated=len(newest) > limit,
    )


def _history(lake: LakeSettings, since: dt.datetime) -> list[dict[str, object]]:
    try:
        horizon = since - OPEN_HORIZON
    except OverflowError:
        horizon = dt.datetime.min.replace(tzinfo=dt.UTC)
    return store.read_events(lake, since=horizon, events=OPENING)


def _newest(row: Mapping[str, object]) -> tuple[object, object]:
    return row["at"], row["window_end"]


def _of(
    rows: Iterable[dict[str, object]], rules: Mapping[str, Rule], access: Access
) -> list[dict[str, object]]:
    """The rows of ``rules`` (by owner and name; a row from before names were per owner, by
    name) that ``access`` may see, each with its rule's owner."""
    by_name: dict[str, list[Rule]] = {}
    for rule in rules.values():
        by_name.setdefault(rule.name, []).append(rule)
    found = []
    for row in rows:
        owner = row.get("owner")
        named = by_name.get(str(row["rule"]), [])
        matched = [r for r in named if owner is None or r.owner == owner]
        if len(matched) == 1 and store.admits_row(matched[0], row, access):
            found.append({**row, "owner": matched[0].owner})
    return found


def open_alerts(rows: Iterable[Mapping[str, object]]) -> dict[Key, Mapping[str, object]]:
    """The latest fired row of each rule and group whose alert is open after ``rows`` (oldest
    first, each with its rule's owner): fired, and neither resolved nor withdrawn since."""
    opened: dict[Key, Mapping[str, object]] = {}
    for row in rows:
        key: Key = (f"{row['owner']}/{row['rule']}", row["group_value"])  # type: ignore[assignment]
        if row["event"] == "fired":
            opened[key] = row
        elif row["event"] in ("resolved", "withdrawn"):
            opened.pop(key, None)
    return opened


def _event(row: Mapping[str, object], opened: Mapping[Key, object]) -> AlertEventBody:
    def finite(name: str) -> float | None:
        value = row.get(name)
        return value if isinstance(value, float) and math.isfinite(value) else None

    fields = {k: v for k, v in row.items() if k in AlertEventBody.model_fields}
    for name in ("current", "baseline", "change", "p_value"):
        fields[name] = finite(name)
    fields["open"] = (f"{row['owner']}/{row['rule']}", row["group_value"]) in opened
    return AlertEventBody.model_validate(fields)
