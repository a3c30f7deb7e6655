"""Every table of the lake, declared once: its name (its path under ``LAKE_ROOT``), its schema,
its partitioning and the name SQL users query it by.

The Arrow schemas here are the contracts of ``docs/concepts/architecture.md``. Spark jobs create
tables from :meth:`Table.spark_schema`, the serving layer reads them with these schemas before
they first exist, and the SQL sandbox and the maintenance DAG list them from :data:`SERVED` and
:data:`MAINTAINED`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from events.records import EVENTS_SCHEMA, REJECTED_SCHEMA
from views.columns import (
    ATTRIBUTION_MEASURES,
    DIMENSIONS,
    SKETCHES,
    USER_BITMAPS,
    USER_LISTS,
    USER_NUMBERS,
)
from views.definitions import DEFINITIONS, Definition

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from lake.settings import LakeSettings

TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_CTR_KEY: Final = [("bucket_start", TIMESTAMP), *((d, pa.string()) for d in DIMENSIONS)]
_MEASURES: Final = [("impressions", pa.int64()), ("clicks", pa.int64())]
_ATTRIBUTION: Final = [(name, pa.int64()) for name in ATTRIBUTION_MEASURES]
# Who the rows reached (views.ctr.with_reach), last: a table written before them gets them
# appended, null in its older rows (reach not measured there).
_SKETCHES: Final = [(name, pa.binary()) for name in SKETCHES]
_REACH: Final = [
    *((name, pa.list_(pa.string())) for name in USER_LISTS),
    *_SKETCHES,
    *((name, pa.list_(pa.int32())) for name in USER_NUMBERS),
]
# The SQL function that unions a list of sketches (views.sketches.register registers it).
SKETCH_UNION: Final = "sketch_union"


@dataclass(frozen=True)
class Table:
    name: str
    schema: pa.Schema
    sql_name: str
    partition_by: tuple[str, ...] = ()
    # Rows are partial counts (speed/ctr: a row per key and micro-batch until the speed job
    # rolls them up): readers sum the counts per these columns (the rest: the newest value).
    summed_by: tuple[str, ...] = ()
    # The processes that commit to it. Every commit goes through delta-rs (lake.frames,
    # lake.append_table), which creates each log entry with a conditional write: with two
    # writing processes, the later commit of a version conflicts and is retried or rerun, on a
    # local disk and on an object store alike (tests/test_s3_lake.py).
    writers: tuple[str, ...] = ()

    def path(self, lake: LakeSettings) -> str:
        return lake.table(self.name)

    def rows_sql(self, source: str) -> str:
        """DuckDB SQL of the table's rows read from ``source`` (a trusted relation name): one
        row per key for a table of partial counts."""
        if not self.summed_by:
            return f"SELECT * FROM {source}"
        return f"SELECT {self.summed_select()} FROM {source} GROUP BY {', '.join(self.summed_by)}"

    def summed_select(self) -> str:
        """The select list that sums a table of partial counts per key (its column order)."""
        return ", ".join(
            name
            if name in self.summed_by
            else f"CAST(sum({name}) AS BIGINT) AS {name}"
            if pa.types.is_integer(self.schema.field(name).type)
            else f"{SKETCH_UNION}(list({name})) AS {name}"
            if pa.types.is_binary(self.schema.field(name).type)
            else f"max({name}) AS {name}"
            for name in self.schema.names
        )

    def spark_schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.schema)


MASTER_EVENTS: Final = Table(
    "master/events",
    EVENTS_SCHEMA,
    "events",
    partition_by=("event_date",),
    writers=("the archiver (appends, compaction, VACUUM)",),
)
MASTER_REJECTED: Final = Table(
    "master/rejected",
    REJECTED_SCHEMA,
    "rejected",
    writers=("the archiver (appends, compaction, VACUUM)",),
)
_BATCH_WRITERS: Final = (
    "batch runs: ctr_batch, ctr_recompute_stale, backfills, ctr views build (the files whose "
    "buckets meet the run's interval replaced in one commit; a conflict reruns the run)",
    "ctr_maintenance (compaction, VACUUM)",
)
BATCH_CTR: Final = Table(
    "batch/ctr",
    pa.schema([*_CTR_KEY, *_MEASURES, ("run_id", pa.string()), *_REACH]),
    "ctr_batch",
    writers=_BATCH_WRITERS,
)
# The batch rows of a version with click attribution (views.ctr.attributed_ctr).
ATTRIBUTED_SCHEMA: Final = pa.schema(
    [*_CTR_KEY, *_MEASURES, *_ATTRIBUTION, ("run_id", pa.string()), *_REACH]
)
BATCH_COVERAGE: Final = Table(
    "batch/coverage",
    pa.schema(
        [
            ("run_id", pa.string()),
            ("view", pa.string()),
            ("interval_start", TIMESTAMP),
            ("interval_end", TIMESTAMP),
            ("input_version", pa.int64()),
            ("rows_written", pa.int64()),
            ("finished_at", TIMESTAMP),
        ]
    ),
    "coverage",
    writers=(
        "batch runs (a row per run, idempotent: a retried run adds none)",
        "ctr_maintenance (compaction, VACUUM)",
    ),
)
# ``clicks`` are the click events (versions 1 and 2); ``attributed_clicks``, ``orphan_clicks``
# and ``repeat_clicks`` the speed layer's approximation of version 3's (speed_layer.job).
SPEED_CTR: Final = Table(
    "speed/ctr",
    pa.schema(
        [
            *_CTR_KEY,
            *_MEASURES,
            ("attributed_clicks", pa.int64()),
            ("orphan_clicks", pa.int64()),
            ("repeat_clicks", pa.int64()),
            ("updated_at", TIMESTAMP),
            *_SKETCHES,
        ]
    ),
    "ctr_speed",
    summed_by=tuple(name for name, _ in _CTR_KEY),
    writers=("the speed job (appends, roll-ups, pruning, compaction, VACUUM)",),
)
SPEED_LATE: Final = Table(
    "speed/late",
    pa.schema(
        [
            ("bucket_start", TIMESTAMP),
            ("impressions", pa.int64()),
            ("clicks", pa.int64()),
            ("batch_id", pa.int64()),
            ("recorded_at", TIMESTAMP),
        ]
    ),
    "late",
    writers=("the speed job",),
)

# What each archiver commit added to master/events, as view rows per minute bucket and
# dimensions, with the master/events version that made them readable: the staleness check
# (lake.coverage.staleness) compares it with the input version of the runs that covered a bucket.
MASTER_ARRIVALS: Final = Table(
    "master/arrivals",
    pa.schema(
        [
            *_CTR_KEY,
            *_MEASURES,
            ("events_version", pa.int64()),
            ("batch_id", pa.int64()),
            ("archived_at", TIMESTAMP),
        ]
    ),
    "arrivals",
    writers=(
        "the archiver (appends, compaction)",
        "batch runs (delete the arrivals they counted; retried on a conflict)",
    ),
)
# Per minute bucket a batch run covered for the first time: what the speed layer had counted
# there and what the batch layer counted.
BATCH_DRIFT: Final = Table(
    "batch/drift",
    pa.schema(
        [
            ("run_id", pa.string()),
            ("view", pa.string()),
            ("bucket_start", TIMESTAMP),
            ("speed_impressions", pa.int64()),
            ("speed_clicks", pa.int64()),
            ("batch_impressions", pa.int64()),
            ("batch_clicks", pa.int64()),
            ("recorded_at", TIMESTAMP),
        ]
    ),
    "drift",
    writers=(
        "batch runs (idempotent per interval)",
        "ctr_maintenance (compaction, VACUUM)",
    ),
)

# Which version of each view is published, and the history of every version (lake.registry).
VIEW_REGISTRY: Final = Table(
    "views/registry",
    pa.schema(
        [
            ("view", pa.string()),
            ("version", pa.int64()),
            ("event", pa.string()),
            ("reason", pa.string()),
            ("at", TIMESTAMP),
        ]
    ),
    "registry",
    writers=(
        "ctr views publish / rollback and ctr_reprocess's publish (appends)",
        "ctr_maintenance (compaction, VACUUM)",
    ),
)

# Who may call the API: an append-only log of API keys created, revoked and used (access.key_store).
# Only a key's SHA-256 is stored. Never served: the SQL sandbox does not see it.
API_KEYS: Final = Table(
    "access/keys",
    pa.schema(
        [
            ("name", pa.string()),
            ("event", pa.string()),  # created | revoked | used
            ("role", pa.string()),  # created only
            ("campaigns", pa.list_(pa.string())),  # created only (an advertiser's scope)
            ("ads", pa.list_(pa.string())),
            ("key_hash", pa.string()),  # created only: sha256 hex of the key
            ("expires_at", TIMESTAMP),
            ("at", TIMESTAMP),
            ("reason", pa.string()),  # revoked only
        ]
    ),
    "keys",
    writers=(
        "ctr keys create / revoke (appends)",
        "the API's usage recorder (an append of last uses, at most one a minute per process)",
        "ctr_maintenance (compaction, VACUUM)",
    ),
)


# Alert rules (alerts.store): an append-only log of rules created and deleted, by `ctr alerts`
# and the API. Holds each rule's webhook secret: never served.
ALERT_RULES: Final = Table(
    "alerts/rules",
    pa.schema(
        [
            ("name", pa.string()),
            ("event", pa.string()),  # created | deleted
            # created: the rule's fields as JSON (alerts.rules); deleted: who deleted it
            ("rule", pa.string()),
            ("owner", pa.string()),  # the key that made it: rule names are per owner
            ("campaign_id", pa.string()),  # created only: the campaign it watches, if one
            ("at", TIMESTAMP),
        ]
    ),
    "alert_rules",
    writers=(
        "ctr alerts create / delete and POST, DELETE /api/v1/alerts (appends)",
        "ctr_maintenance (compaction, VACUUM)",
    ),
)
# What the alert evaluator (ctr alerts run) found: a row per rule, window and group tested, and
# an alert's transitions (fired, resolved; confirmed or withdrawn once the batch layer covers
# its window) with their delivery. One writer; a window is evaluated once per rule (the
# commit's application transaction), restarts included.
ALERT_EVENTS: Final = Table(
    "alerts/events",
    pa.schema(
        [
            ("rule", pa.string()),  # the rule's name (its owner's)
            # evaluated | fired | resolved | confirmed | withdrawn, or a delivery's outcome:
            # delivered | dead_letter (not delivered: refused, throttled or failed)
            ("event", pa.string()),
            ("window_start", TIMESTAMP),
            ("window_end", TIMESTAMP),
            ("group_value", pa.string()),  # the `per` dimension's value; null: the whole rule
            ("campaign_id", pa.string()),  # the campaign the rule watches, if one (scopes)
            ("measure", pa.string()),
            ("current", pa.float64()),
            ("baseline", pa.float64()),
            ("change", pa.float64()),
            ("p_value", pa.float64()),  # after Holm's correction over the rule's groups
            ("significant", pa.bool_()),
            ("evidence", pa.string()),  # exact | approximate | too little data
            ("trials", pa.int64()),  # the window's impressions (raw clicks for orphan share)
            ("reason", pa.string()),
            # an alert's: pending | no webhook; a delivery's: delivered | refused | throttled |
            # failed (the details are in the evaluator's log, never here: its owner reads it)
            ("delivery", pa.string()),
            ("at", TIMESTAMP),
            # the rule's owner (null: written before rule names were per owner)
            ("owner", pa.string()),
        ]
    ),
    "alert_events",
    writers=("ctr alerts run (appends)", "ctr_maintenance (compaction, VACUUM)"),
)


# Per hour a batch run covered whole, and combination of dimensions: the hour's counts and who
# it reached, as bitmaps of user numbers (exact) and the hour's sketches unioned (estimates),
# written by the run after its minute rows (batch_layer.hours). The serving layer reads an
# hour's row in place of its 60 minute rows while the minute rows are that run's.
_HOUR_SCHEMA: Final = pa.schema(
    [
        *_CTR_KEY,
        *_MEASURES,
        ("run_id", pa.string()),
        *((name, pa.binary()) for name in USER_BITMAPS),
        *_SKETCHES,
    ]
)
# Per hour a batch run covered whole, and single dimension value (``dimension`` names it,
# ``value`` is its value; both empty: the hour's whole traffic): who the hour reached there, as
# bitmaps of user numbers, written by the run after its hour rows (batch_layer.reach_cube). The
# serving layer counts a day's reach per campaign (or ad, site, country, device type, or in
# all) from these few rows instead of every combination's hour rows, while the minute rows are
# that run's.
_REACH_CUBE_SCHEMA: Final = pa.schema(
    [
        ("bucket_start", TIMESTAMP),
        ("dimension", pa.string()),
        ("value", pa.string()),
        ("run_id", pa.string()),
        *((name, pa.binary()) for name in USER_BITMAPS),
    ]
)
# The user dictionary: one dense number per user id (from 1), given by the batch run that
# first saw the user (batch_layer.users). User ids: never served.
BATCH_USERS: Final = Table(
    "batch/users",
    pa.schema([("user_id", pa.string()), ("user_no", pa.int32())]),
    "users",
    writers=(
        "batch runs (appends of the users they number; two at once conflict, one numbers again)",
        "ctr_maintenance (compaction, VACUUM)",
    ),
)


def hours_table(definition: Definition) -> Table:
    """The hour rows of a view version (:data:`_HOUR_SCHEMA`): ``batch/ctr_hours`` for
    version 1, ``batch/ctr_vN_hours`` after."""
    batch = batch_table(definition)
    return Table(
        f"{batch.name}_hours", _HOUR_SCHEMA, f"{batch.sql_name}_hours", writers=_BATCH_WRITERS
    )


def reach_cube_table(definition: Definition) -> Table:
    """The reach cube of a view version (:data:`_REACH_CUBE_SCHEMA`): ``batch/ctr_reach`` for
    version 1, ``batch/ctr_vN_reach`` after."""
    batch = batch_table(definition)
    return Table(
        f"{batch.name}_reach",
        _REACH_CUBE_SCHEMA,
        f"{batch.sql_name}_reach",
        writers=_BATCH_WRITERS,
    )


def batch_table(definition: Definition) -> Table:
    """The batch rows of a view version: ``batch/ctr`` for version 1, ``batch/ctr_vN`` after
    (same schema, plus the attribution measures for a version with attribution; coverage rows
    of every version share ``batch/coverage``, keyed by ``Definition.key`` in its ``view``
    column)."""
    if definition.version == 1:
        return BATCH_CTR
    return Table(
        f"batch/{definition.view}_v{definition.version}",
        ATTRIBUTED_SCHEMA if definition.attribution else BATCH_CTR.schema,
        f"{definition.view}_batch_v{definition.version}",
        writers=_BATCH_WRITERS,
    )


VERSIONED: Final = tuple(batch_table(d) for d in DEFINITIONS if d.version != 1)
HOURS: Final = tuple(hours_table(d) for d in DEFINITIONS)
REACH_CUBES: Final = tuple(reach_cube_table(d) for d in DEFINITIONS)

# What the serving layer reads and the SQL sandbox exposes (speed/late is the speed job's own;
# access/keys, the API keys' hashes, is read by the API's key check alone: access.key_watcher).
SERVED: Final = (
    BATCH_CTR,
    BATCH_COVERAGE,
    SPEED_CTR,
    MASTER_EVENTS,
    MASTER_REJECTED,
    MASTER_ARRIVALS,
    BATCH_DRIFT,
    VIEW_REGISTRY,
    *VERSIONED,
    *HOURS,
    *REACH_CUBES,
)
# Every served table by its name (``speed/ctr`` -> SPEED_CTR).
SERVED_BY_NAME: Final = {t.name: t for t in SERVED}
# What the maintenance DAG compacts and vacuums: not the streaming jobs' tables (master/*,
# speed/*), which their writer compacts and vacuums between two micro-batches.
MAINTAINED: Final = (
    BATCH_CTR,
    BATCH_COVERAGE,
    BATCH_DRIFT,
    VIEW_REGISTRY,
    API_KEYS,
    BATCH_USERS,
    ALERT_RULES,
    ALERT_EVENTS,
    *VERSIONED,
    *HOURS,
    *REACH_CUBES,
)
