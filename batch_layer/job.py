"""The batch job: recompute the CTR view of one interval exactly, from the master dataset.

Reads ``master/events`` at its current version for the interval (partition pruning on
``event_date``, then ``event_time`` in [start, end)), keeps one row per ``event_id``, numbers
the interval's users (:mod:`batch_layer.users`, for reach), applies the shared view, and
replaces exactly that interval of ``batch/ctr`` in one atomic commit: Spark's tasks write the
files, the driver commits them (:mod:`lake.view_files`). Only then does it write the hour rows
of the hours it covered whole (:mod:`batch_layer.hours`) and append a row to
``batch/coverage``. Rerunning an interval gives the same rows; events that arrived late are
counted whenever their interval is recomputed.

Before it covers a minute no run covered before, it records in ``batch/drift`` what the speed
layer had counted there next to the exact counts (:mod:`batch_layer.drift`). After
the coverage row, it forgets the ``master/arrivals`` rows its input version counted, so only
later arrivals mark a bucket stale. A commit conflict with a concurrent run (a backfill, the
stale recompute, ``ctr_batch``) retries the whole run on the newer input version.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from batch_layer import metrics as batch_metrics
from batch_layer.drift import record_drift
from batch_layer.errors import BatchError
from batch_layer.hours import write_hours
from batch_layer.interval import Interval
from batch_layer.reach_cube import write_reach_cube
from batch_layer.users import number_users
from events.records import EVENTS_SCHEMA
from lake import view_files
from lake.arrivals import forget_counted, forget_settled
from lake.catalog import MASTER_EVENTS, batch_table
from lake.coverage import log as coverage_log
from lake.coverage.model import CoverageRun
from lake.registry import Registry, read_registry
from lake.settings import LakeSettings
from lake.storage import is_delta, open_delta
from runtime.connectors import is_commit_conflict, read_delta
from views.ctr import attributed_ctr, ctr
from views.definitions import Definition

if TYPE_CHECKING:
    from deltalake import DeltaTable as DeltaLakeTable
    from pyspark.sql import DataFrame, SparkSession

    from runtime.metrics import MetricsSettings

VIEW = "ctr"
COMMIT_ATTEMPTS = 4
# Parquet bytes of master/events per partition of the dedup's sort. A partition's rows are
# sorted in memory; on a 2-core machine with a 2 GB driver, 4 partitions of the benchmark's
# 10M events (87 MB each) spilled 0.5 GB to disk and cost a fifth more CPU than 11 of 32 MB.
DEDUP_INPUT_BYTES_PER_PARTITION = 32 * 2**20


class MissingTableError(BatchError, LookupError):
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
    view: str = VIEW  # the version's key (``ctr``, ``ctr@v3``)
    input_bytes: int = 0  # of master/events: the files the interval touches


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


def _require_events(lake: LakeSettings) -> None:

    if not is_delta(MASTER_EVENTS.path(lake), lake.object_store):
        raise MissingTableError(
            f"master/events does not exist at {MASTER_EVENTS.path(lake)}: run `ctr archive` first "
            "(or point LAKE_ROOT at the lake)"
        )


class ComputedView(NamedTuple):
    view: DataFrame
    version: int  # of master/events (or the replay's input version)
    run_id: str
    input_bytes: int  # of the events read (lake.view_files.write_tasks)
    users_added: int  # to the user dictionary (batch_layer.users), for reach
    partitions: int  # the view's exchanges (dedup_partitions): its rows fit them


def compute_view(  # noqa: PLR0913 - keyword-only options of one computation
    spark: SparkSession,
    interval: Interval,
    *,
    lake: LakeSettings,
    definition: Definition,
    run_id: str | None = None,
    replay: Replay | None = None,
    reach: bool = True,
    on_step: Callable[[str], None] = lambda step: None,
) -> ComputedView:
    """The exact rows of ``definition`` for ``interval`` from master/events at its current
    version (or from a ``replay``): rows with ``run_id``, the master/events version they
    hold, the run id, and the bytes of events they are computed from. Same interval,
    definition and input version -> same run id, so a rerun writes identical rows.
    ``reach``: with who each row reached (:func:`views.ctr.with_reach`; without, the view
    leaves those columns out and the write stores them null: the benchmark's comparison). Its
    users are numbered first: the interval's users the dictionary has not got are added to it
    (a commit of ``batch/users``, :mod:`batch_layer.users`), and each event joined to its
    user's number (Spark's planner broadcasts the dictionary while it is small, and
    sort-merges once it is not)."""
    from pyspark.sql import functions as F

    path = replay.events if replay else MASTER_EVENTS.path(lake)
    table = open_delta(path, lake.object_store)
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
    widened = (
        interval if window is None else Interval(interval.start - window, interval.end + window)
    )
    events, partitions, input_bytes = interval_events(spark, path, table, widened)
    if definition.where:
        events = events.where(definition.where)
    deduplicated = deduplicate(events, partitions)
    users_added = 0
    if reach:
        dictionary = number_users(spark, lake, events.select("user_id"), on_step=on_step)
        users_added = dictionary.added
        deduplicated = deduplicated.join(dictionary.users, "user_id", "left")
    if window is None:
        view = ctr(deduplicated, reach=reach, partitions=partitions)
    else:
        view = attributed_ctr(deduplicated, window, reach=reach, partitions=partitions).where(
            interval.sql_predicate("bucket_start")
        )
    return ComputedView(
        view.withColumn("run_id", F.lit(run_id)),
        version,
        run_id,
        input_bytes,
        users_added,
        partitions,
    )


class IntervalEvents(NamedTuple):
    events: DataFrame
    partitions: int  # to deduplicate them in (dedup_partitions)
    input_bytes: int  # of the files of the partitions read, the interval's share of them


def interval_events(
    spark: SparkSession, path: str, table: DeltaLakeTable, interval: Interval
) -> IntervalEvents:
    """The events of ``interval`` in the table at ``path`` (master/events or a replay's) at the
    version ``table`` (delta-rs, the same table) was opened at, only the ``event_date``
    partitions the interval touches; the partitions to :func:`deduplicate` them in, sized by
    those partitions' files; and the interval's share of those files' bytes (the days' bytes
    in proportion to the interval's time: how many tasks write its view).

    The driver lists the files from the log it holds already (delta-rs: metadata, no data
    file opened); Spark's tasks read them. Letting delta-spark read the table instead costs a
    Spark job per read to rebuild the table's state from its log (50 tasks on a cluster, 8 of
    35 s of a run over 200,000 events on one core: ``python -m bench scale``), and its
    answers to the driver."""
    days = [d.isoformat() for d in interval.days]
    files, input_bytes = _partition_files(table, "event_date", days)
    events = view_files.read_files(spark, path, EVENTS_SCHEMA, files)
    events = events.where(interval.sql_predicate("event_time"))
    partitions = dedup_partitions(input_bytes, spark.sparkContext.defaultParallelism)
    share = (interval.end - interval.start) / (dt.timedelta(days=1) * max(1, len(days)))
    return IntervalEvents(events, partitions, int(input_bytes * min(1.0, share)))


class BatchJob:
    """The batch job of one command (``ctr batch``, a backfill, a build, a stale recompute):
    the view registry read once, then :meth:`run` per interval. ``on_step`` hears each step;
    each run's figures go to ``metrics``' Pushgateway when it ends (none: not pushed)."""

    def __init__(
        self,
        spark: SparkSession,
        lake: LakeSettings,
        *,
        registry: Registry | None = None,
        on_step: Callable[[str], None] = lambda step: None,
        metrics: MetricsSettings | None = None,
    ) -> None:
        self.spark = spark
        self.lake = lake
        self.registry = registry or read_registry(lake)
        self.on_step = on_step
        self.metrics = metrics

    def run(
        self,
        interval: Interval,
        *,
        definition: Definition | None = None,
        run_id: str | None = None,
        replay: Replay | None = None,
        reach: bool = True,
    ) -> BatchRun:
        """Recompute the batch rows of ``definition`` (default: the published version of
        ``ctr``) for ``interval`` and record the coverage (and the drift of the minutes it
        covers for the first time); a commit conflict with a concurrent run retries.
        ``reach=False`` leaves reach unmeasured (the benchmark's comparison)."""
        if replay is None:
            _require_events(self.lake)
        definition = definition or self.registry.published(VIEW)
        started = time.monotonic()
        try:
            run = self._run_retried(interval, definition, run_id, replay, reach)
        except Exception:
            if self.metrics is not None:
                batch_metrics.push_failed(definition.key, time.monotonic() - started, self.metrics)
            raise
        if self.metrics is not None:
            batch_metrics.push_succeeded(run, time.monotonic() - started, self.metrics)
        return run

    def _run_retried(
        self,
        interval: Interval,
        definition: Definition,
        run_id: str | None,
        replay: Replay | None,
        reach: bool,
    ) -> BatchRun:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return self._run_once(
                    interval, definition, run_id=run_id, replay=replay, reach=reach
                )
            except Exception as exc:
                if not is_commit_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise
                self.on_step(f"a concurrent run committed first ({type(exc).__name__}); rerunning")
        raise AssertionError("unreachable")

    def _run_once(
        self,
        interval: Interval,
        definition: Definition,
        *,
        run_id: str | None,
        replay: Replay | None,
        reach: bool = True,
    ) -> BatchRun:
        from pyspark.sql import functions as F

        spark, lake, on_step = self.spark, self.lake, self.on_step
        view, version, run_id, input_bytes, users_added, partitions = compute_view(
            spark,
            interval,
            lake=lake,
            definition=definition,
            run_id=run_id,
            replay=replay,
            reach=reach,
            on_step=on_step,
        )
        target = batch_table(definition)
        source = "the replayed log" if replay else f"master/events v{version}"
        on_step(f"reading {source} for {interval} ({definition.key})")
        # Computed once, straight into the files (caching the view to count it first cost more
        # than the view: 11 of 37 s on the 10M-event benchmark): Spark's tasks write them, the
        # driver commits their descriptions (lake.view_files); the drift then reads the run's
        # own rows back, a few columns.
        on_step(f"computing the view and replacing {interval} of {target.name} with it")
        replaced = view_files.replace_interval(
            spark,
            view,
            name=target.name,
            path=target.path(lake),
            store=lake.object_store,
            schema=target.schema,
            interval=interval,
            run_id=run_id,
            input_version=version,
            properties=lake.retention(target.name),
            input_bytes=input_bytes,
        )
        # The run's own rows: those of the files it added (or, committed before, of the table).
        written = (
            view_files.read_files(spark, target.path(lake), target.schema, replaced.files)
            if replaced.committed
            else read_delta(spark, target.path(lake))
        )
        written = written.where(interval.sql_predicate("bucket_start")).where(
            F.col("run_id") == F.lit(run_id)
        )
        if replaced.committed:
            rows = replaced.rows
            on_step(
                f"wrote {rows:,} rows in {replaced.files_added:,} file(s), replacing "
                f"{replaced.files_removed:,}"
                + (f" ({replaced.rows_carried:,} rows outside the interval kept)"
                   if replaced.rows_carried else "")
            )  # fmt: skip
        else:
            rows = written.count()
            on_step(f"this run ({run_id}) was committed before: {rows:,} rows")
        if reach:
            # The view's exchange held each partition's events in an Arrow task: their minute
            # rows, far fewer, fit the same partitions.
            hours = write_hours(
                spark, lake, written, interval, definition=definition, run_id=run_id,
                input_version=version, partitions=partitions, on_step=on_step,
            )  # fmt: skip
            if hours.committed:
                on_step(
                    f"wrote {hours.rows:,} hour rows for {hours.hours:,} whole hour(s) "
                    f"({users_added:,} new users numbered)"
                )
            cube = write_reach_cube(
                spark, lake, written, interval, definition=definition, run_id=run_id,
                input_version=version, on_step=on_step,
            )  # fmt: skip
            if cube.committed:
                on_step(f"wrote {cube.rows:,} reach cube rows for {cube.hours:,} whole hour(s)")
        minutes = record_drift(
            spark, lake, written, interval, definition=definition, run_id=run_id, at=_now()
        )
        if minutes:
            on_step(f"recorded the speed layer's drift in {minutes:,} newly covered minute(s)")
        on_step("recording coverage")
        run = CoverageRun(
            run_id, definition.key, interval.start, interval.end, version, rows, _now()
        )
        coverage_log.record(lake, run)
        self._forget_arrivals(interval, definition, version)
        return BatchRun(run_id, interval, version, rows, definition.key, input_bytes)

    def _forget_arrivals(self, interval: Interval, definition: Definition, version: int) -> None:
        """Forget the master/arrivals rows the run counted, only while no other version may
        still need them (a version being built, or one to roll back to, keeps them: see
        :mod:`lake.coverage.staleness`)."""
        if self.registry.live(definition.view) != (definition,):
            return
        if definition.attribution is not None:
            forgotten = forget_settled(
                self.lake,
                view=definition.key,
                start=interval.start,
                end=interval.end,
                window=definition.attribution,
            )
        else:
            forgotten = forget_counted(
                self.lake, start=interval.start, end=interval.end, input_version=version
            )
        if not forgotten:
            self.on_step(
                "master/arrivals kept changing under the clean-up: the arrivals this run "
                "counted stay (not stale; the next run over these minutes removes them)"
            )


def run(  # noqa: PLR0913 - keyword-only options of one run
    spark: SparkSession,
    interval: Interval,
    *,
    lake: LakeSettings,
    definition: Definition | None = None,
    run_id: str | None = None,
    on_step: Callable[[str], None] = lambda step: None,
    replay: Replay | None = None,
    reach: bool = True,
) -> BatchRun:
    """One run of :class:`BatchJob`, the registry read now."""
    job = BatchJob(spark, lake, on_step=on_step)
    return job.run(interval, definition=definition, run_id=run_id, replay=replay, reach=reach)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _partition_files(
    table: DeltaLakeTable, column: str, values: list[str]
) -> tuple[list[str], int]:
    """``table``'s data files in the partitions where ``column`` is one of ``values`` (paths
    relative to its root, as its log writes them) and their bytes (from its log: no data file
    is opened)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return [], 0
    chosen = files.filter(
        pc.is_in(files.column(f"partition.{column}").cast(pa.string()), pa.array(values))
    )
    size = int(pc.sum(chosen.column("size_bytes")).as_py() or 0)
    return [str(p) for p in chosen.column("path").to_pylist()], size
