"""Response and request models of the HTTP API (they define the OpenAPI schema)."""

from __future__ import annotations

import datetime as dt
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field


class ErrorResponse(BaseModel):
    detail: str = Field(description="what was wrong, for a person to read")
    parameter: str | None = Field(default=None, description="the request parameter at fault")


class FreshnessBody(BaseModel):
    latest_covered_bucket: dt.datetime | None = Field(
        description="start of the last minute the batch layer made exact"
    )
    latest_speed_bucket: dt.datetime | None = Field(description="newest minute in speed/ctr")
    speed_updated_at: dt.datetime | None = Field(description="last report of the speed job")
    speed_watermark: dt.datetime | None = Field(
        description="the speed job's watermark: events of minutes before it arrive too late "
        "for the speed layer's counts (the batch layer counts them)"
    )
    speed_lag_records: int | None = Field(description="Kafka records the speed job has not read")
    versions: dict[str, int | None] = Field(description="Delta table versions the answer read")
    settle_minutes: int = Field(
        description="how long after a minute the batch layer covers it: on-time events (and, "
        "with attribution, clicks within the window) can change it until then, so the newer "
        "minutes are the speed layer's"
    )
    clicks_window_minutes: int = Field(
        description="the view's click attribution window (0 without attribution): a bucket "
        "younger than this can still receive its impressions' clicks, so its CTR still rises "
        "(the dashboard marks it: clicks still arriving)"
    )


class CtrRowBody(BaseModel):
    """One bucket and group. Dimension fields are present when grouped by them."""

    bucket_start: dt.datetime = Field(description="the bucket's start, UTC, at the granularity")
    campaign_id: str | None = Field(None, description="the group's campaign (grouped by it)")
    ad_id: str | None = Field(None, description="the group's ad (grouped by it)")
    site_id: str | None = Field(None, description="the group's site (grouped by it)")
    country: str | None = Field(None, description="the group's country (grouped by it)")
    device_type: str | None = Field(None, description="the group's device type (grouped by it)")
    impressions: int = Field(description="impression events (deduplicated by event id)")
    clicks: int = Field(
        description="without attribution (versions 1 and 2): the click events in the bucket; "
        "with attribution (version 3): the impressions of the bucket and group clicked at least "
        "once within the version's window after them (the click credited to its impression's "
        "bucket and dimensions), so clicks <= impressions"
    )
    raw_clicks: int = Field(
        description="every valid click event (deduplicated by event id) in its own bucket: the "
        "clicks of a version without attribution (equal to clicks there)"
    )
    orphan_clicks: int | None = Field(
        description="click events with no impression within the window before them (counted "
        "in the click's bucket); null for a version without attribution"
    )
    repeat_clicks: int | None = Field(
        description="clicks on an impression after its first click (counted in the "
        "impression's bucket); null for a version without attribution"
    )
    ctr: float | None = Field(description="clicks / impressions; null without impressions")
    ctr_ci_low: float | None = Field(description="95% Wilson interval of ctr, lower bound (<= ctr)")
    ctr_ci_high: float | None = Field(
        description="95% Wilson interval of ctr, upper bound (>= ctr when clicks <= "
        "impressions, always so with attribution; the proportion is capped at 1)"
    )
    source: Literal["batch", "stale", "speed", "mixed"] = Field(
        description="batch: every minute of the bucket (in range) is covered by a batch run and "
        "exact; stale: every minute is covered, but some received events after the run that "
        "covered them (stale_events: they are included, approximately, until a recompute); "
        "speed: no minute is covered; mixed: some are"
    )
    covered_fraction: float = Field(
        ge=0,
        le=1,
        description="how much of the bucket (its minutes within the queried range) batch runs "
        "cover: 1 for batch and stale rows, 0 for speed rows, in between for mixed ones",
    )
    stale_events: int = Field(
        description="events in this row that arrived after the batch run covering their minute "
        "and are not yet recomputed (counted as archived, duplicates included); 0 when exact"
    )
    run_ids: list[str] = Field(description="the batch runs whose rows the bucket holds")
    reach: int | None = Field(
        None,
        description="with reach=true (the reach fields are absent otherwise): distinct users "
        "with an impression in the row (its bucket, group and filters): exact when "
        "reach_exact, else the sketch's estimate (reach_low..reach_high); null where rows "
        "written before reach was measured are included",
    )
    reach_low: int | None = Field(
        None,
        description="lower bound of reach: reach when exact; for an estimate two standard "
        "errors below it (about 95 %); for a stale row the batch layer's exact count",
    )
    reach_high: int | None = Field(
        None,
        description="upper bound of reach: reach when exact; for an estimate two standard "
        "errors above it; for a stale row the exact count plus one user per late event",
    )
    reach_exact: bool | None = Field(
        None,
        description="true when every minute of the row is covered by a batch run with no late "
        "event since (source batch): reach and clicking_users are then exact distinct counts",
    )
    frequency: float | None = Field(
        None, description="impressions per user reached (impressions / reach); null without reach"
    )
    clicking_users: int | None = Field(
        None,
        description="distinct users with a click event in the row (every click, attributed or "
        "not): exact when reach_exact, else an estimate",
    )


class CtrQueryEcho(BaseModel):
    """The query as answered (start/end rounded up to the minute)."""

    start: dt.datetime = Field(description="the range's start, UTC (inclusive)")
    end: dt.datetime = Field(description="the range's end, UTC (exclusive)")
    granularity: Literal["minute", "hour", "day", "all"] = Field(description="the buckets' size")
    group_by: list[str] = Field(description="the dimensions grouped by")
    filters: dict[str, list[str]] = Field(description="per dimension, the values kept")
    order_by: list[str] = Field(description="the order of the rows")
    limit: int = Field(description="the most rows answered")


class ViewRef(BaseModel):
    name: str = Field(description="the view (ctr)")
    version: int = Field(description="the view version the answer comes from")


class CtrResponse(BaseModel):
    """The merged view's rows for the range, grouped and ordered as asked, and which view
    and version answered."""

    view: ViewRef = Field(description="the view and version that answered")
    rows: list[CtrRowBody] = Field(description="the buckets and groups, ordered as asked")
    truncated: bool = Field(description="more rows matched than 'limit'")
    query: CtrQueryEcho = Field(description="the query as answered")
    freshness: FreshnessBody = Field(
        description="how fresh the answer is: each layer's newest minute, the speed job's lag, "
        "the tables' versions"
    )


class CoveredIntervalBody(BaseModel):
    start: dt.datetime = Field(description="UTC, inclusive")
    end: dt.datetime = Field(description="UTC, exclusive")


class TableInfoBody(BaseModel):
    table: str = Field(description="the table's name (its path under LAKE_ROOT)")
    version: int | None = Field(description="Delta version; null if the table does not exist")
    rows: int = Field(description="rows at that version")
    files: int = Field(description="data files at that version")


class StaleIntervalBody(BaseModel):
    start: dt.datetime = Field(description="UTC, inclusive")
    end: dt.datetime = Field(description="UTC, exclusive")
    events: int = Field(description="late events in the interval no batch run has counted")
    first_archived_at: dt.datetime = Field(
        description="when the oldest of them was archived (the interval is stale since)"
    )


class DriftBody(BaseModel):
    """How far the speed layer was from the exact counts, in the minutes the latest runs covered
    for the first time: per event (``*_weighted``: sum |speed - batch| / sum batch, every minute)
    and per minute (relative error |speed - batch| / batch, percentiles over the minutes with at
    least 100 events of the measure in the batch layer: a minute of a few late events says
    nothing of the speed layer)."""

    runs: int = Field(description="runs summarised (the latest that recorded drift)")
    buckets: int = Field(description="minutes compared")
    impressions_weighted: float | None = Field(
        description="sum |speed - batch| / sum batch over the minutes compared (null: none)"
    )
    clicks_weighted: float | None = Field(description="as impressions_weighted, for clicks")
    impressions_p50: float | None = Field(description="over minutes of 100+ batch impressions")
    impressions_p99: float | None = Field(description="over minutes of 100+ batch impressions")
    clicks_p50: float | None = Field(description="over minutes of 100+ batch clicks")
    clicks_p99: float | None = Field(description="over minutes of 100+ batch clicks")
    speed_minus_batch_impressions: int = Field(
        description="speed - batch over those minutes: duplicates the speed layer counted "
        "minus events it dropped (later than its watermark)"
    )
    speed_minus_batch_clicks: int = Field(
        description="as speed_minus_batch_impressions, for clicks"
    )


class VersionInfoBody(BaseModel):
    version: int = Field(description="the version's number")
    summary: str = Field(description="what the version counts (its definition in code)")
    where: str | None = Field(description="the events it keeps; null: all")
    state: Literal["not built", "building", "ready", "published", "retired"] = Field(
        description="its state in views/registry"
    )
    covered_intervals: list[CoveredIntervalBody] = Field(
        description="the intervals its batch runs covered (merged)"
    )
    runs: int | None = Field(description="batch runs recorded; null for an advertiser key")
    rows: int | None = Field(
        description="rows in the version's batch table; null for an advertiser key"
    )


class ViewInfoBody(BaseModel):
    name: str = Field(description="the view (ctr)")
    version: int = Field(description="the published version, which the other fields describe")
    versions: list[VersionInfoBody] = Field(description="every version of it, in code")
    covered_intervals: list[CoveredIntervalBody] = Field(
        description="the intervals the published version's batch runs covered (merged)"
    )
    runs: int | None = Field(
        description="batch runs recorded in batch/coverage; null for an advertiser key"
    )
    latest_covered_bucket: dt.datetime | None = Field(
        description="start of the last minute the batch layer made exact"
    )
    latest_speed_bucket: dt.datetime | None = Field(description="newest minute in speed/ctr")
    tables: dict[str, TableInfoBody] = Field(
        description="the tables' versions, rows and files; empty for an advertiser key"
    )
    stale_intervals: list[StaleIntervalBody] = Field(
        description="covered minutes with events no batch run has counted yet (merged; for "
        "an advertiser key, its campaigns' events); `ctr batch --stale` or the "
        "ctr_recompute_stale DAG makes them exact"
    )
    drift: DriftBody | None = Field(
        description="counted over every campaign: null for an advertiser key"
    )


class AccessResponse(BaseModel):
    """Who the key is: its name, role and, for an advertiser, its campaigns and ads; whether it
    may read the raw tables and /metrics."""

    name: str = Field(description="the key's name (API_TOKEN for the server's token)")
    scope: Literal["admin", "analyst", "advertiser"] = Field(description="the key's role")
    campaigns: list[str] | None = Field(
        description="an advertiser key's campaigns (every answer holds their rows only); "
        "null: every campaign"
    )
    ads: list[str] | None = Field(description="an advertiser key's ads; null: every ad")
    raw_tables: bool = Field(description="whether SQL may read events and rejected")
    metrics: bool = Field(description="whether /metrics answers it")


class ViewsResponse(BaseModel):
    """Per view: covered and stale intervals, runs, the latest batch and speed buckets, each
    table's rows, files and Delta version; and the freshness of each layer."""

    views: list[ViewInfoBody] = Field(description="one per view")
    freshness: FreshnessBody = Field(
        description="each layer's newest minute, the speed job's lag, the tables' versions"
    )


class SqlRequest(BaseModel):
    sql: str = Field(
        min_length=1,
        max_length=100_000,
        examples=["SELECT source, sum(clicks) FROM ctr GROUP BY 1"],
        description="one read-only query (SELECT, WITH, FROM, VALUES, TABLE, DESCRIBE, SHOW, "
        "SUMMARIZE, or EXPLAIN of a query) calling only allowed functions (GET "
        "/api/v1/sql/functions lists them)",
    )
    max_rows: int | None = Field(default=None, ge=1, description="at most API_SQL_MAX_ROWS")
    as_of: dt.datetime | None = Field(
        default=None,
        description="ISO-8601, no offset = UTC: query the Delta versions current at this moment",
    )


class SqlResponse(BaseModel):
    """The query's columns, their DuckDB types and its rows (JSON values), and whether rows
    were cut off at a limit."""

    columns: list[str] = Field(description="the columns' names")
    types: list[str] = Field(description="the columns' DuckDB types")
    rows: list[list[object]] = Field(
        description="the rows, each a list in the columns' order: JSON values (times ISO-8601 "
        "UTC; decimals and integers past 64 bits as strings; bytes as text, or base64: marked)"
    )
    truncated: bool = Field(description="rows were cut off at a limit (see truncated_by)")
    truncated_by: Literal["max_rows", "max_bytes"] | None = Field(
        description="max_rows: the row limit; max_bytes: API_SQL_MAX_BYTES of JSON rows"
    )
    elapsed_ms: float = Field(description="the query's time in its worker")


class SqlFunctionsResponse(BaseModel):
    """The table functions and the scalar, aggregate and window functions a query may call."""

    table_functions: list[str] = Field(description="allowed in FROM")
    functions: dict[str, list[str]] = Field(
        description="allowed scalar, aggregate and window functions and operators, by kind"
    )


class Health(BaseModel):
    """The process is up; with an admin or analyst key, the lake's table versions it reads."""

    status: Literal["ok"] = Field(description="always ok: the process answers")
    versions: dict[str, int | None] | None = Field(
        default=None,
        description="the lake's table versions, by table; only with an admin or analyst key "
        "(API_TOKEN included)",
    )


class Readiness(BaseModel):
    """Whether this replica can answer: a load balancer sends it requests only when ready."""

    status: Literal["ready", "not ready"] = Field(description="whether to send it requests")
    detail: str | None = Field(default=None, description="why not, when not ready")


# -- alerts (alerts.rules, alerts.store) --------------------------------------------------------

AlertMeasure = Literal["ctr", "impressions", "clicks", "orphan_share"]
AlertDimension = Literal["campaign_id", "ad_id", "site_id", "country", "device_type"]


class AlertWhereBody(BaseModel):
    """The rows a rule watches: one dimension's value."""

    model_config = ConfigDict(extra="forbid")

    dimension: AlertDimension = Field(description="the dimension watched")
    value: str = Field(description="an id as the events carry it (campaign_id: cmp-7)")


class AlertRuleRequest(BaseModel):
    """A new rule: what to watch, against which baseline, how sure and how large a change must
    be before it fires (the fields of `ctr alerts create`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="1 to 64 of A-Z a-z 0-9 . _ -; unique among the key's rules")
    measure: AlertMeasure = Field(
        default="ctr",
        description="ctr (clicks / impressions), impressions or clicks (per minute), "
        "orphan_share (orphan clicks / raw clicks: a view with click attribution)",
    )
    where: AlertWhereBody | None = Field(
        default=None,
        description="the rows watched; null: every row. An advertiser key's rule must watch "
        "one of its campaigns (campaign_id) or ads (ad_id), and counts only the rows of its "
        "scope (a key that names ads: those ads)",
    )
    per: AlertDimension | None = Field(
        default=None,
        description="test each value of this dimension on its own (one alert each), the "
        "false-alarm rate held over them all (Holm); null: one test",
    )
    window_minutes: int = Field(default=15, description="the window: the last closed minutes")
    baseline: Literal["days", "previous"] = Field(
        default="days",
        description="days: the same window on each of baseline_days days before; previous: "
        "the baseline_minutes right before the window",
    )
    baseline_days: int = Field(default=7, description="days of a days baseline (1 to 28)")
    baseline_minutes: int = Field(
        default=60, description="minutes of a previous baseline (the window to 7 days)"
    )
    alpha: float = Field(
        default=0.01,
        description="significance level: the chance of a false alarm per group and day, "
        "between 0 and 0.5",
    )
    min_effect: float = Field(
        default=0.2, description="smallest relative change worth an alert (0.2: 20 %)"
    )
    direction: Literal["drop", "rise", "any"] = Field(
        default="any", description="the changes that fire: a drop, a rise, or any"
    )
    min_trials: int = Field(
        default=1000,
        description="impressions (raw clicks for orphan_share) the window needs before a rate "
        "is tested",
    )
    webhook_url: str | None = Field(
        default=None,
        description="an http(s) URL its alerts are POSTed to, signed; a public address (or "
        "one the operator allows: ALERTS_WEBHOOK_ALLOW), redirects not followed",
    )


# A stored rule's fields mean what they meant in the request that created it.
_RULE: Final = {name: field.description for name, field in AlertRuleRequest.model_fields.items()}


class AlertRuleBody(BaseModel):
    """A stored rule (never its webhook secret)."""

    name: str = Field(description=_RULE["name"])
    description: str = Field(description="what it watches and when it fires, in one line")
    measure: AlertMeasure = Field(description=_RULE["measure"])
    where: AlertWhereBody | None = Field(description=_RULE["where"])
    per: str | None = Field(description=_RULE["per"])
    window_minutes: int = Field(description=_RULE["window_minutes"])
    baseline: Literal["days", "previous"] = Field(description=_RULE["baseline"])
    baseline_days: int = Field(description=_RULE["baseline_days"])
    baseline_minutes: int = Field(description=_RULE["baseline_minutes"])
    alpha: float = Field(description=_RULE["alpha"])
    min_effect: float = Field(description=_RULE["min_effect"])
    direction: Literal["drop", "rise", "any"] = Field(description=_RULE["direction"])
    min_trials: int = Field(description=_RULE["min_trials"])
    webhook_url: str | None = Field(
        description="where its alerts are posted; null: none, or (an advertiser key) a rule "
        "of another key's"
    )
    owner: str = Field(
        description="the key that created it (ctr: the command line); names are per owner"
    )
    created_at: dt.datetime | None = Field(description="when it was created")


class AlertRuleCreated(AlertRuleBody):
    """The rule as stored, with its webhook's signing secret (shown this once)."""

    secret: str = Field(
        description="the webhook's signing secret, shown this once: a receiver checks "
        "X-Ctr-Signature (HMAC-SHA256 of timestamp.body) with it"
    )


class AlertRulesResponse(BaseModel):
    """The alert rules the key sees."""

    rules: list[AlertRuleBody] = Field(
        description="the rules the key sees: every rule for an admin or analyst key, an "
        "advertiser's those on its campaigns or ads"
    )


class AlertEventBody(BaseModel):
    """A row of alerts/events: an alert's transition, a delivery's outcome, or (asked for) an
    evaluation."""

    rule: str = Field(description="the rule's name")
    owner: str | None = Field(
        description="the rule's owner (null: written before rule names were per owner)"
    )
    event: Literal[
        "evaluated", "fired", "resolved", "confirmed", "withdrawn", "delivered", "dead_letter"
    ] = Field(
        description="an alert's transition (fired, resolved; confirmed or withdrawn once the "
        "batch layer covers its window), a delivery's outcome, or an evaluation"
    )
    window_start: dt.datetime = Field(description="the start of the window tested")
    window_end: dt.datetime = Field(description="the end of the window tested (exclusive)")
    group_value: str | None = Field(description="the rule's `per` value; null: the whole rule")
    campaign_id: str | None = Field(description="the campaign the rule watches, if one")
    measure: str | None = Field(description="what the rule watches")
    current: float | None = Field(description="the window's value (a rate, or per minute)")
    baseline: float | None = Field(description="the baseline's value")
    change: float | None = Field(description="current / baseline - 1")
    p_value: float | None = Field(description="after Holm's correction over the rule's groups")
    significant: bool | None = Field(
        description="beyond chance at the rule's level, at least its minimum effect, in its "
        "direction"
    )
    evidence: str | None = Field(
        description="exact (the batch layer's counts), approximate (the speed layer's) or too "
        "little data"
    )
    trials: int | None = Field(description="the window's impressions (raw clicks for orphan_share)")
    reason: str | None = Field(description="why not tested")
    delivery: str | None = Field(
        description="an alert's: pending or no webhook; a delivery's: delivered, refused (its "
        "destination is not allowed), throttled (over the deliveries a minute) or failed"
    )
    at: dt.datetime = Field(description="the evaluation it was found in")
    open: bool = Field(
        description="whether the alert of this rule and group is open now: fired and neither "
        "resolved nor withdrawn since"
    )


class AlertEventsResponse(BaseModel):
    """Alert events, newest first, and the alerts open now."""

    events: list[AlertEventBody] = Field(description="newest first")
    open: list[AlertEventBody] = Field(
        description="the alerts open now, each its latest fired row (it may be older than "
        "since, within a day before it)"
    )
    truncated: bool = Field(description="more rows matched than 'limit'")
