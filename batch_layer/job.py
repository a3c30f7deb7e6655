"""The batch job: recompute the CTR view of one interval exactly, from the master dataset.

Reads ``master/events`` at its current version for the interval (partition pruning on
``event_date``, then ``event_time`` in [start, end)), keeps one row per ``event_id``, applies the
shared view, and replaces exactly that interval of ``batch/ctr`` in one atomic commit. Only then
does it append a row to ``batch/coverage``. Rerunning an interval gives the same rows; events
that arrived late are counted whenever their interval is recomputed.

Before it covers a minute no run covered before, it records in ``batch/drift`` what the speed
layer had counted there next to the exact counts (the speed rows are pruned once covered). After
the coverage row, it forgets the ``master/arrivals`` rows its input version counted, so only
later arrivals mark a bucket stale. A commit conflict with a concurrent run (a backfill, the
stale recompute, ``ctr_batch``) retries the whole run on the newer input version.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batch_layer.interval import Interval
from lake.arrivals import forget_counted, forget_settled
from lake.catalog import BATCH_COVERAGE, BATCH_DRIFT, SPEED_CTR, SPEED_LATE, batch_table
from lake.coverage import Coverage
from lake.coverage_log import CoverageRow, record
from lake.maintenance import covered_intervals
from lake.registry import read_registry
from lake.settings import LakeSettings
from runtime.formats import is_commit_conflict, read_delta, write_delta
from views.ctr import attributed_ctr, ctr
from views.definitions import Definition

if TYPE_CHECKING:
    from deltalake import DeltaTable as DeltaLakeTable
    from pyspark.sql import DataFrame, SparkSession

VIEW = "ctr"
COMMIT_ATTEMPTS = 4
# Parquet bytes of master/events per partition of the dedup's sort. A partition's rows are
# sorted in memory; on a 2-core machine with a 2 GB driver, 4 partitions of the benchmark's
# 10M events (87 MB each) spilled 0.5 GB to disk and cost a fifth more CPU than 11 of 32 MB.
DEDUP_INPUT_BYTES_PER_PARTITION = 32 * 2**20


class MissingTableError(LookupError):
    """The master dataset is not there yet."""


@dataclass(frozen=True)
class Replay:
    """Events replayed from the Kafka log into a private master dataset (a Kappa build): the
    batch job reads them from ``events`` instead of master/events, and records
    ``input_version``, the master/events version the replay holds at least (the version when it
    began: the replay read the topic at least as far as the archiver had), so staleness is
    still judged against master/events."""

    events: str
    input_version: int


@dataclass(frozen=True)
class BatchRun:
    run_id: str
    interval: Interval
    input_version: int
    rows_written: int


def deduplicate(events: DataFrame, partitions: int) -> DataFrame:
    """One row per event_id: the first one archived (lowest ingest time, then Kafka
    partition and offset), so the choice does not depend on how Spark splits the work.

    The rows are exchanged by ``event_id`` into ``partitions`` before the window. Left to
    itself, Spark plans a partial "first row per id" (WindowGroupLimit) in front of that
    exchange, which sorts every row to drop the rare later copies; an exchange the window's
    partitioning already satisfies makes it redundant. Each partition's rows are then sorted in
    memory: :func:`dedup_partitions` sizes them.

    Measured on the 10M-event benchmark (2 cores): this window (then with the partial limit, 4
    partitions) 19-24 s; ``min`` of a struct per id 25 s, ``dropDuplicates`` 27 s (and not
    deterministic), only the repeated ids through the window (a hash aggregate over the ids,
    then anti and semi joins) 39 s; a signed view (all rows' view minus the extra copies',
    the repeated ids found by a hash aggregate and a broadcast semi-join) 25-34 s; ``min_by``
    of a struct over sorted rows (a sort aggregate) 33 % more CPU than the window.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spread = events.repartition(partitions, "event_id")
    first = Window.partitionBy("event_id").orderBy("ingest_time", "kafka_partition", "kafka_offset")
    return spread.withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n")


def dedup_partitions(input_bytes: int, parallelism: int) -> int:
    """Partitions for :func:`deduplicate` over ``input_bytes`` of master/events files: about
    :data:`DEDUP_INPUT_BYTES_PER_PARTITION` each, at least one per core (``parallelism``)."""
    if input_bytes < 0 or parallelism < 1:
        raise ValueError(
            f"input_bytes must be >= 0 and parallelism >= 1, got {input_bytes}, {parallelism}"
        )
    return max(parallelism, -(-input_bytes // DEDUP_INPUT_BYTES_PER_PARTITION))


def run(
    spark: SparkSession,
    interval: Interval,
    *,
    lake: LakeSettings,
    definition: Definition | None = None,
    run_id: str | None = None,
    on_step: Callable[[str], None] = lambda step: None,
    replay: Replay | None = None,
) -> BatchRun:
    """Recompute the batch rows of ``definition`` (default: the published version of ``ctr``)
    for ``interval`` and record the coverage (and the drift of the minutes it covers for the
    first time); a commit conflict with a concurrent run retries."""
    if replay is None:
        _require_events(lake)
    registry = read_registry(lake)
    definition = definition or registry.published(VIEW)
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return _run_once(
                spark,
                interval,
                lake=lake,
                definition=definition,
                run_id=run_id,
                on_step=on_step,
                replay=replay,
            )
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                raise
            on_step(f"a concurrent run committed first ({type(exc).__name__}); rerunning")
    raise AssertionError("unreachable")


def _require_events(lake: LakeSettings) -> None:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(lake.events):
        raise MissingTableError(
            f"master/events does not exist at {lake.events}: run `ctr archive` first "
            "(or point LAKE_ROOT at the lake)"
        )


def compute_view(
    spark: SparkSession,
    interval: Interval,
    *,
    lake: LakeSettings,
    definition: Definition,
    run_id: str | None = None,
    replay: Replay | None = None,
) -> tuple[DataFrame, int, str]:
    """The exact rows of ``definition`` for ``interval`` from master/events at its current
    version (or from a ``replay``): (rows with ``run_id``, the master/events version they
    hold, the run id). Same interval, definition and input version -> same run id, so a rerun
    writes identical rows."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    path = replay.events if replay else lake.events
    table = DeltaTable(path)
    read = table.version()
    version = replay.input_version if replay else read
    prefix = definition.key.replace("@", "-") + ("-replay" if replay else "")
    run_id = (
        run_id or f"{prefix}-{interval.start:%Y%m%dT%H%M}-{interval.end:%Y%m%dT%H%M}-v{version}"
    )
    # With attribution, a click up to the window after an impression of the interval is
    # credited to it, and a click of the interval is an orphan only without an impression up to
    # the window before it: the events of the interval widened by the window on both sides are
    # read, and the rows of the interval kept.
    window = definition.attribution
    reach = interval if window is None else Interval(interval.start - window, interval.end + window)
    events, partitions = interval_events(spark, path, table, reach)
    if definition.where:
        events = events.where(definition.where)
    deduplicated = deduplicate(events, partitions)
    if window is None:
        view = deduplicated.transform(ctr)
    else:
        view = attributed_ctr(deduplicated, window).where(interval.sql_predicate("bucket_start"))
    return view.withColumn("run_id", F.lit(run_id)), version, run_id


def interval_events(
    spark: SparkSession, path: str, table: DeltaLakeTable, interval: Interval
) -> tuple[DataFrame, int]:
    """The events of ``interval`` in the table at ``path`` (master/events or a replay's) at the
    version ``table`` (delta-rs, the same table) was opened at, only the ``event_date``
    partitions the interval touches; and the partitions to :func:`deduplicate` them in, sized
    by those partitions' files."""
    days = [d.isoformat() for d in interval.days]
    events = read_delta(
        spark, path, version=table.version(), partitions={"event_date": days}
    ).where(interval.sql_predicate("event_time"))
    input_bytes = _partition_bytes(table, "event_date", days)
    return events, dedup_partitions(input_bytes, spark.sparkContext.defaultParallelism)


def _run_once(
    spark: SparkSession,
    interval: Interval,
    *,
    lake: LakeSettings,
    definition: Definition,
    run_id: str | None,
    on_step: Callable[[str], None],
    replay: Replay | None,
) -> BatchRun:
    view, version, run_id = compute_view(
        spark, interval, lake=lake, definition=definition, run_id=run_id, replay=replay
    )
    target = batch_table(definition)
    source = "the replayed log" if replay else f"master/events v{version}"
    on_step(f"reading {source} for {interval} ({definition.key})")
    # Computed once, straight into the write (caching the view to count it first cost more
    # than the view: 11 of 37 s on the 10M-event benchmark); the count and the drift then
    # read the rows back, a few columns of the run's own rows.
    from pyspark.sql import functions as F

    on_step(f"computing the view and replacing {interval} of {target.name} with it")
    where = interval.sql_predicate("bucket_start")
    write_delta(view, target.path(lake), mode="overwrite", replace_where=where)
    written = (
        read_delta(spark, target.path(lake)).where(where).where(F.col("run_id") == F.lit(run_id))
    )
    rows = written.count()
    on_step(f"wrote {rows:,} rows")
    drift = record_drift(
        spark, lake, written, interval, definition=definition, run_id=run_id, at=_now()
    )
    if drift:
        on_step(f"recorded the speed layer's drift in {drift:,} newly covered minute(s)")
    on_step("recording coverage")
    record(
        spark,
        BATCH_COVERAGE.path(lake),
        CoverageRow(run_id, definition.key, interval.start, interval.end, version, rows, _now()),
    )
    # Arrivals a run counted are forgotten only while no other version may still need them
    # (a version being built, or one to roll back to, keeps them: see lake.staleness).
    if read_registry(lake).live(definition.view) == (definition,):
        if definition.attribution is not None:
            forgotten = forget_settled(
                lake,
                view=definition.key,
                start=interval.start,
                end=interval.end,
                window=definition.attribution,
            )
        else:
            forgotten = forget_counted(
                lake, start=interval.start, end=interval.end, input_version=version
            )
        if not forgotten:
            on_step(
                "master/arrivals kept changing under the clean-up: the arrivals this run "
                "counted stay (not stale; the next run over these minutes removes them)"
            )
    return BatchRun(run_id, interval, version, rows)


def record_drift(
    spark: SparkSession,
    lake: LakeSettings,
    view: DataFrame,
    interval: Interval,
    *,
    definition: Definition,
    run_id: str,
    at: dt.datetime,
) -> int:
    """Append to ``batch/drift``, per minute of ``interval`` that no run covered before and the
    speed layer saw (counted in ``speed/ctr``, or dropped as later than its watermark into
    ``speed/late``), the speed and the batch counts; returns the minutes recorded.

    Idempotent per interval. Minutes covered before are left out: their speed rows (if any) hold
    only what arrived after the speed layer's pruning, not its estimate of the bucket."""
    from pyspark.sql import functions as F

    speed_path, late_path = SPEED_CTR.path(lake), SPEED_LATE.path(lake)
    if not _is_delta(spark, speed_path):
        return 0
    before = covered_intervals(spark, lake, view=definition.key)
    fresh = Coverage(_uncovered(before, interval.start, interval.end))
    if not fresh.intervals:
        return 0
    in_fresh = fresh.sql_predicate("bucket_start")
    if definition.where:  # the speed layer counts every event; this version counts fewer
        in_fresh = f"{in_fresh} AND ({definition.where})"
    # The speed layer's estimate of the version's clicks: its credited clicks for a version
    # with attribution (null in rows written before it counted them).
    speed = read_delta(spark, speed_path)
    speed_clicks = (
        F.coalesce(F.col("attributed_clicks"), F.lit(0))
        if definition.attribution is not None and "attributed_clicks" in speed.columns
        else F.col("clicks")
    )
    counted = (
        speed.where(in_fresh)
        .groupBy("bucket_start")
        .agg(
            F.sum("impressions").alias("speed_impressions"),
            F.sum(speed_clicks).alias("speed_clicks"),
        )
    )
    seen = counted.select("bucket_start")
    if _is_delta(spark, late_path):
        late_fresh = fresh.sql_predicate("bucket_start")  # speed/late has no dimensions
        seen = seen.union(read_delta(spark, late_path).where(late_fresh).select("bucket_start"))
    batch = view.groupBy("bucket_start").agg(
        F.sum("impressions").alias("batch_impressions"), F.sum("clicks").alias("batch_clicks")
    )
    zero = F.lit(0)
    drift = (
        seen.distinct()
        .join(counted, "bucket_start", "left")
        .join(batch, "bucket_start", "left")
        .select(
            F.lit(run_id).alias("run_id"),
            F.lit(definition.key).alias("view"),
            "bucket_start",
            *(
                F.coalesce(column, zero).cast("long").alias(column)
                for column in (
                    "speed_impressions",
                    "speed_clicks",
                    "batch_impressions",
                    "batch_clicks",
                )
            ),
            F.lit(at).cast("timestamp").alias("recorded_at"),
        )
        .coalesce(1)
        .persist()
    )
    try:
        minutes = drift.count()
        if minutes:
            # Keyed by interval: a run retried after a conflict (another run id) adds no rows.
            key = f"drift:{definition.key}:{interval.start:%Y%m%dT%H%M}-{interval.end:%Y%m%dT%H%M}"
            write_delta(drift, BATCH_DRIFT.path(lake), txn=(key, 0))
        return minutes
    finally:
        drift.unpersist()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _uncovered(
    coverage: Coverage, start: dt.datetime, end: dt.datetime
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The parts of [start, end) ``coverage`` does not hold."""
    gaps, cursor = [], start
    for lo, hi in coverage.within(start, end):
        if cursor < lo:
            gaps.append((cursor, lo))
        cursor = hi
    if cursor < end:
        gaps.append((cursor, end))
    return gaps


def _partition_bytes(table: DeltaLakeTable, column: str, values: list[str]) -> int:
    """Bytes of ``table``'s data files in the partitions where ``column`` is one of
    ``values`` (from its log: no data file is opened)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return 0
    chosen = pc.is_in(files.column(f"partition.{column}").cast(pa.string()), pa.array(values))
    return int(pc.sum(files.filter(chosen).column("size_bytes")).as_py() or 0)


def _is_delta(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))
