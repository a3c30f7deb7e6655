"""What each column of the lake's tables means, for the tables reference (docs/reference/
tables.md): by column name where a name means one thing in every table, by table and name where
it differs. Every column of :mod:`lake.catalog` has a meaning (a unit test holds it)."""

from __future__ import annotations

from typing import Final

# A name's meaning in every table that has it (unless a table says otherwise, below).
BY_NAME: Final[dict[str, str]] = {
    # the view's key and counts
    "bucket_start": "the minute the row counts, UTC: its start",
    "campaign_id": "the campaign (a dimension)",
    "ad_id": "the ad (a dimension)",
    "site_id": "the site the ad ran on (a dimension)",
    "country": "the viewer's country, ISO 3166-1 alpha-2 (a dimension)",
    "device_type": "the viewer's device type (a dimension)",
    "impressions": "impression events counted, each event id once",
    "clicks": "click events counted, each event id once",
    "raw_clicks": "every click event, in the click's own bucket (version 1's clicks)",
    "orphan_clicks": "clicks credited to no impression (in the click's bucket and dimensions)",
    "repeat_clicks": "clicks after an impression's first credited one (in the impression's bucket)",
    "attributed_clicks": "the speed layer's estimate of version 3's clicks: the impressions "
    "clicked within the attribution window",
    "run_id": "the batch run that wrote the row (batch/coverage's run_id)",
    # who the rows reached
    "users": "the distinct user ids with an impression in the row (rows written before the "
    "user dictionary; null since: see user_nos)",
    "clickers": "the distinct user ids with a click in the row (as users)",
    "reach_sketch": "an HLL sketch (Apache DataSketches; compact HLL_4 since 2026-11-30, older "
    "rows HLL_8) of the users with an impression: unioned and estimated by sketch_union / "
    "sketch_estimate; sealed below admin",
    "clicker_sketch": "an HLL sketch of the users with a click (as reach_sketch)",
    "user_nos": "the distinct users with an impression, as their numbers in batch/users, sorted "
    "(exact reach; admins only)",
    "clicker_nos": "the distinct users with a click, as numbers (as user_nos)",
    "user_bitmap": "a Roaring bitmap of the numbers (batch/users) of the users with an "
    "impression (exact reach; admins only)",
    "clicker_bitmap": "a Roaring bitmap of the numbers of the users with a click",
    "user_id": "the user's id, as the ad server sent it (user-level data: admins only)",
    "user_no": "the user's dense number, from 1, given by the batch run that first saw the user",
    # the events
    "event_id": "the event's id: the key of the exact dedup (copies of one event share it)",
    "event_type": "impression or click",
    "event_time": "when the ad server saw the event (the event's time, not its arrival)",
    "impression_id": "the impression the event belongs to (a click names the impression it "
    "follows); the platform's producer sends it as the Kafka record's key",
    "schema_version": "the event contract's version the record was written in",
    "event_date": "the UTC date of event_time (the table's partition)",
    "kafka_topic": "the Kafka topic the record was read from",
    "kafka_partition": "the Kafka partition the record was read from",
    "kafka_offset": "the record's offset in its partition (with the partition: where it is in "
    "the log)",
    "kafka_timestamp": "the Kafka record's timestamp",
    "ingest_time": "the Kafka record's timestamp",
    # coverage, drift, arrivals
    "view": "the view version the row is about: ctr for version 1, ctr@v2, ctr@v3 after",
    "interval_start": "the start of the interval the run covered, UTC (inclusive)",
    "interval_end": "the end of the interval the run covered, UTC (exclusive)",
    "input_version": "the master/events version the run read: later arrivals make its buckets "
    "stale",
    "rows_written": "the rows the run wrote",
    "finished_at": "when the run committed",
    "events_version": "the master/events version that made these arrivals readable",
    "batch_id": "the micro-batch (the archiver's or the speed job's) that wrote the row",
    "archived_at": "when the archiver committed the arrivals",
    "speed_impressions": "the impressions the speed layer had counted in the bucket",
    "speed_clicks": "the clicks the speed layer had counted in the bucket",
    "batch_impressions": "the impressions the batch run counted in the bucket",
    "batch_clicks": "the clicks the batch run counted in the bucket",
    "recorded_at": "when the row was written",
    "updated_at": "when the speed job last wrote to the row (the newest of its partial rows)",
    # the registry, keys, alerts
    "version": "the view's version",
    "name": "the key's name (one live key a name)",
    "role": "created: admin, analyst or advertiser",
    "campaigns": "created, an advertiser's: the campaigns its answers hold",
    "ads": "created, an advertiser's: the ads its answers hold (empty: every ad of the campaigns)",
    "key_hash": "created: the key's SHA-256, hex (the key itself is never stored)",
    "expires_at": "created: when the key stops working (null: never)",
    "at": "when it happened",
    "rule": "the alert rule (its name, per owner)",
    "owner": "the key that made the rule (rule names are per owner)",
    "window_start": "the start of the window evaluated, UTC",
    "window_end": "the end of the window evaluated, UTC (exclusive)",
    "group_value": "the value of the rule's `per` dimension for this group (null: the whole rule)",
    "measure": "what the rule watches: ctr, impressions, clicks or orphan_share",
    "current": "the measure over the window",
    "baseline": "the measure over the rule's baseline",
    "change": "current against baseline, relative: current / baseline - 1 (0.25: 25 % up; null "
    "without a baseline)",
    "p_value": "the test's p-value, after Holm's correction over the rule's groups",
    "significant": "whether the change is beyond chance at the rule's level (after the "
    "correction), at least its minimum effect and in its direction",
    "evidence": "exact (the batch layer covers the window), approximate (the speed layer's) or "
    "too little data",
    "trials": "the window's impressions (its raw clicks for the orphan share)",
    "delivery": "an alert's: pending or no webhook; a delivery's: delivered, refused, throttled "
    "or failed",
    # the reach cube
    "dimension": "the dimension the row is about (campaign_id, ad_id, site_id, country, "
    "device_type); empty: the hour's whole traffic",
}

# Where a name means something else in one table.
BY_TABLE: Final[dict[tuple[str, str], str]] = {
    ("master/rejected", "value"): "the Kafka record's bytes as they arrived",
    ("master/rejected", "key"): "the Kafka record's key bytes (null: none)",
    ("master/rejected", "reason"): "why it was rejected (record: not JSON, or the field and "
    "the rule it broke)",
    ("batch/ctr_reach", "value"): "the dimension's value (empty with an empty dimension)",
    ("speed/late", "impressions"): "impressions of a bucket the speed job had closed (before "
    "its watermark) when they arrived: not in speed/ctr",
    ("speed/late", "clicks"): "clicks of a closed bucket, as impressions",
    ("master/arrivals", "impressions"): "impression events the archiver's commit added to "
    "master/events in the bucket",
    ("master/arrivals", "clicks"): "click events the archiver's commit added to master/events "
    "in the bucket",
    ("speed/ctr", "clicks"): "click events counted so far (partial: readers sum them per key)",
    ("speed/ctr", "impressions"): "impressions counted so far (partial: readers sum them per key)",
    ("views/registry", "view"): "the view (ctr); the version is its own column",
    ("views/registry", "event"): "building, ready, published or retired",
    ("views/registry", "reason"): "why (a rollback's, a publish's note)",
    ("access/keys", "event"): "created, revoked or used",
    ("access/keys", "reason"): "revoked: why",
    ("access/keys", "at"): "when it was created or revoked; used: the last use recorded",
    ("alerts/rules", "name"): "the rule's name (per owner)",
    ("alerts/rules", "event"): "created or deleted",
    ("alerts/rules", "rule"): "created: the rule's fields as JSON; deleted: who deleted it",
    ("alerts/rules", "campaign_id"): "created: the campaign the rule watches, if one",
    ("alerts/events", "event"): "evaluated, fired, resolved, confirmed, withdrawn, or a "
    "delivery's outcome: delivered, dead_letter",
    ("alerts/events", "campaign_id"): "the campaign the rule watches, if one (keys' scopes)",
    ("alerts/events", "reason"): "why the window was not tested (too little data, or the "
    "speed layer's counts held back); null when it was",
    ("alerts/events", "owner"): "the rule's owner (null: written before rule names were per owner)",
}

# Version 3's clicks are credited to impressions (views.ctr.attributed_ctr).
_ATTRIBUTED_CLICKS: Final = (
    "the impressions clicked within the attribution window after them, in the impression's "
    "bucket and dimensions"
)


def meaning(table: str, column: str) -> str | None:
    """What ``column`` of ``table`` means (None: not written down)."""
    if column == "clicks" and table.startswith("batch/ctr_v3"):
        return _ATTRIBUTED_CLICKS
    if column == "bucket_start" and table.endswith(("_hours", "_reach")):
        return "the hour the row counts, UTC: its start"
    if table.endswith("_reach") and column == "value":
        return BY_TABLE[("batch/ctr_reach", "value")]
    return BY_TABLE.get((table, column), BY_NAME.get(column))
