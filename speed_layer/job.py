"""The speed job: approximate CTR views of the last minutes, fresh within seconds.

A Structured Streaming query from the event topic. Each micro-batch is one Spark job, a task per
core over whole Kafka partitions, and its records never leave the tasks
(:mod:`speed_layer.tasks`): a task parses its records with the shared validator (invalid ones
are skipped and counted; the archiver keeps them), counts its events with the view's definition
(:func:`views.ctr.ctr_arrow`, held equal to the batch layer's :func:`views.ctr.ctr` by a test),
closes the buckets whose end the batch's watermark has passed (their events are dropped and
counted per bucket in ``speed/late``), attributes its clicks, and writes its files of
``speed/ctr`` (partial counts per bucket and dimensions) and ``speed/late``. The event-time
watermark follows Spark's rule (the newest event time seen in earlier batches, less
``SPEED_WATERMARK``, never moving back), computed by the job from the tasks' newest event times
(no Spark operator sees the parsed events: a second Python pass per task cost more than the
count itself) and kept in each ``speed/ctr`` commit, so a replayed batch runs under the
watermark it first ran under and a restarted job goes on from it. The driver commits the files
the tasks describe with delta-rs (:mod:`speed_layer.tables`), each commit carrying (query id,
batch id), so a micro-batch replayed after a crash changes nothing twice. The job also keeps
``speed/ctr`` small: it rolls up the files of closed buckets (summed per key), deletes what the
batch layer covers, and vacuums, in a thread of its own beside the micro-batches (one writing
process; the pass's commits change no data, or delete covered buckets the stream never writes,
so the stream's appends go on committing while it runs).

Version 3 of ``ctr`` attributes clicks to their impressions (within an hour after them, in
the impression's bucket and dimensions). The speed job approximates it without a
stream-stream join, which would hold an hour of impressions in Spark's state and delay them:
each task keeps the impressions of the open buckets of its Kafka partitions (clicks share their
impression's key, so its partition: :mod:`speed_layer.state`, persisted beside the checkpoint,
so a restart keeps it) and, per micro-batch, adds ``attributed_clicks``, ``repeat_clicks`` (on
the impression's key) and ``orphan_clicks`` (on the click's key) to the rows it writes;
``clicks`` stays every click event in its own bucket, for versions 1 and 2. Summed per key,
attributed clicks never exceed impressions.

Approximate by design: no deduplication (a duplicated event counts twice until the batch layer
covers its bucket) and late events beyond the watermark are not counted. Attribution: a click
whose impression came more than about the watermark before it (its bucket closed) or arrives
after it counts as an orphan where the batch layer attributes it: orphans overstated,
attributed and repeat clicks understated, until the batch layer covers those buckets.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from events.records import one_task_per_core
from lake.catalog import SPEED_CTR, SPEED_LATE
from lake.checkpoints import Checkpoint
from lake.coverage.log import read_runs
from lake.data_files import files_of
from lake.registry import read_registry
from lake.settings import LakeSettings
from lake.speed_status import write_status
from lake.storage import is_delta, open_delta
from runtime.connectors import SPEED_GROUP, read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.streaming import (
    MAINTENANCE_JOIN_SECONDS,
    BackgroundPass,
    KafkaLag,
    Periodic,
    PhaseClock,
    RecentPhases,
    StreamProgress,
    drive,
)
from runtime.times import EPOCH
from speed_layer import state
from speed_layer.errors import SpeedError
from speed_layer.rewrite import spark_rewrite
from speed_layer.settings import SpeedSettings
from speed_layer.tables import NEXT_WATERMARK, SpeedTable
from speed_layer.tasks import (
    SUMMARY,
    TASK_SCHEMA,
    MicroBatch,
    closed_before,
    count_and_write,
    open_from_ms,
)
from views.ctr import ctr_arrow
from views.definitions import versions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ctr.speed")

OBSERVATION: Final = "speed"
# The attribution window of the version of ``ctr`` that attributes clicks (version 3).
ATTRIBUTION: Final = next(d.attribution for d in versions("ctr") if d.attribution is not None)
STATE_DIR: Final = "attribution"  # the attribution's state, in the checkpoint's directory


class SpeedStateError(SpeedError, RuntimeError):
    """speed/ctr holds counts from another streaming query (its checkpoint is gone)."""


def build_query(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: SpeedSettings,
    available_now: bool = False,
    writer: SpeedBatchWriter | None = None,
) -> StreamingQuery:
    """Start the speed query (it runs until stopped, or until caught up if available_now)."""
    checkpoint = lake.checkpoint(settings.checkpoint_name)
    writer = writer or SpeedBatchWriter(lake, checkpoint, settings)
    _check_fresh_start(lake, Checkpoint(checkpoint, lake.object_store))
    raw = read_kafka(
        spark,
        kafka,
        stream=True,
        group_prefix=SPEED_GROUP,
        startingOffsets=settings.starting_offsets,
        maxOffsetsPerTrigger=str(settings.max_offsets_per_trigger),
        failOnDataLoss=str(settings.fail_on_data_loss).lower(),
    )
    stream = (
        raw.writeStream.foreachBatch(writer)
        .option("checkpointLocation", checkpoint)
        .queryName("ctr-speed")
    )
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return stream.start()


def _check_fresh_start(lake: LakeSettings, checkpoint: Checkpoint) -> None:
    """A new checkpoint re-reads the log from the start: refuse to add that to old counts."""

    path = SPEED_CTR.path(lake)
    if checkpoint.exists() or not is_delta(path, lake.object_store):
        return
    if open_delta(path, lake.object_store).to_pyarrow_dataset().head(1).num_rows:
        raise SpeedStateError(
            f"{path} holds counts but the speed checkpoint {checkpoint.location} is missing "
            "(on this host, if CHECKPOINT_ROOT is a local folder), so the job "
            "would count the retained log again; run `ctr speed --reset` to rebuild speed/ctr "
            "from the log (the batch layer is unaffected)"
        )


class SpeedBatchWriter:
    """foreachBatch function: the micro-batch's view, split at the watermark, appended to
    ``speed/late`` and ``speed/ctr`` with the clicks attributed to the open impressions;
    beside the batches, in a thread of its own, the roll-up and maintenance."""

    def __init__(self, lake: LakeSettings, checkpoint: str, settings: SpeedSettings) -> None:
        retention = settings.vacuum_retention_hours
        store = lake.object_store

        def tables() -> tuple[SpeedTable, SpeedTable]:
            return (
                SpeedTable(
                    SPEED_CTR.path(lake), store, SPEED_CTR.schema, retention_hours=retention
                ),
                SpeedTable(
                    SPEED_LATE.path(lake), store, SPEED_LATE.schema, retention_hours=retention
                ),
            )

        # The micro-batches' commits, and the maintenance pass's (roll-ups, compaction,
        # pruning, VACUUM): a handle each, as they run in different threads.
        self.ctr, self.late = tables()
        self.kept_ctr, self.kept_late = tables()
        self._pass = BackgroundPass("speed-maintenance")
        # A delete of covered buckets conflicts with any commit that adds rows meanwhile (Delta's
        # conflict check): the pass's deletes and the micro-batches' commits take turns. The
        # compactions' commits change no data and need no turn.
        self._commit_turn = threading.Lock()
        # What the last maintenance pass did, milliseconds per part (for the log and the
        # benchmark: it no longer belongs to a micro-batch).
        self.last_pass: dict[str, int] = {}
        self.lake = lake
        self.checkpoint = Checkpoint(checkpoint, lake.object_store)
        self.settings = settings
        self.late_events = 0  # since this process started
        # The attribution's state, per Kafka partition (speed_layer.state), and the last batch
        # that changed each partition's (from the tasks' answers; empty at start).
        self.state_root = f"{checkpoint}/{STATE_DIR}"
        self._state_batches: dict[int, int] = {}
        # The event-time watermark the next batch runs under (None: read from speed/ctr's last
        # commit at the first batch), and the one each recent batch ran under (its status).
        self._watermark_ms: int | None = None
        self.watermarks: dict[int, int] = {}
        # Per micro-batch: milliseconds per phase of this callback (and the view's row count).
        self.phases = RecentPhases()
        # The roll-ups reached this bucket: files of earlier buckets are rolled up (read from
        # speed/ctr's log at start).
        self._rolled_up_before: dt.datetime | None = None
        self._rolled_up_known = False
        self._rollup = Periodic(settings.rollup_seconds)
        # The first pass a minute after the start: see Periodic.
        self.maintenance_due = Periodic(settings.maintenance_seconds, first_after_s=60)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        clock = PhaseClock()
        query = self.checkpoint.query_id()
        app_id = f"ctr-speed-{query}"
        metadata = self.checkpoint.batch_metadata(batch_id)
        if self.kept_ctr.rewrite is None:  # the roll-ups' and compactions' rewrites: Spark tasks
            self.kept_ctr.rewrite = spark_rewrite(batch.sparkSession)
        if self._watermark_ms is None:
            # Where the last committed batch left the watermark (a restart goes on from it).
            self._watermark_ms = self.ctr.next_watermark_ms() or 0
        if self.ctr.committed(app_id, batch_id):
            # A replay of a batch whose counts are in (late ones are committed first): nothing
            # to compute or write.
            log.info("batch %d: already in speed/ctr (replayed after a restart)", batch_id)
            return
        late_due = not self.late.committed(app_id, batch_id)
        plan = MicroBatch(
            batch_id=batch_id,
            watermark_ms=self._watermark_ms,
            timestamp_ms=metadata.timestamp_ms,
            ctr_root=self.ctr.path,
            late_root=self.late.path if late_due else None,
            state_root=self.state_root,
            store=self.lake.object_store,
            query=query,
            window=ATTRIBUTION,
            previous=dict(self._state_batches),
            snapshot_every=self.settings.state_snapshot_batches,
        )
        clock.lap("plan")
        # One Spark job, a task per core: each counts, attributes and writes its share; only
        # the files' descriptions and a summary per task come back.
        task = functools.partial(count_and_write, plan=plan, view_of=ctr_arrow)
        tasks = one_task_per_core(batch).mapInArrow(task, from_arrow_schema(TASK_SCHEMA))
        answers = tasks.toArrow()
        clock.lap("tasks")
        rows = answers.to_pylist()
        files = [r for r in rows if r["table"] != SUMMARY]
        summaries = [json.loads(r["summary"]) for r in rows if r["table"] == SUMMARY]
        late_events = 0
        if late_due and self._commit(self.late, files, SPEED_LATE.name, app_id, batch_id):
            late_events = sum(int(s["late_events"]) for s in summaries)
            self.late_events += late_events
        clock.lap("late_commit")
        newest = [int(s["newest_event_ms"]) for s in summaries if s["newest_event_ms"] is not None]
        watermark = self._watermark_ms
        if newest:  # Spark's rule: the newest event time seen, less the delay; never back
            watermark = max(watermark, max(newest) - self.settings.watermark_ms)
        next_watermark = {NEXT_WATERMARK: str(watermark)}
        self._commit(self.ctr, files, SPEED_CTR.name, app_id, batch_id, next_watermark)
        clock.lap("ctr_commit")
        for summary in summaries:
            self._state_batches.update({int(p): int(b) for p, b in summary["state"].items()})
            for name, ms in summary["task_ms"].items():
                clock.ms[f"task.{name}"] = clock.ms.get(f"task.{name}", 0) + int(ms)
        if self.start_maintenance(plan.watermark_ms):
            clock.lap("maintenance_start")
        self._watermark_ms = watermark
        totals = {
            name: sum(int(s[name]) for s in summaries)
            for name in ("records", "invalid", "events", "view_rows", "open_impressions",
                         "state_files_read", "state_snapshots")
        }  # fmt: skip
        totals.update(late_events=late_events, result_bytes=answers.nbytes)
        self.phases.record(batch_id, clock.ms, totals)
        self.watermarks[batch_id] = plan.watermark_ms
        for old in sorted(self.watermarks)[:-8]:
            del self.watermarks[old]

    def _commit(  # noqa: PLR0917
        self,
        table: SpeedTable,
        files: list[dict[str, Any]],
        name: str,
        app_id: str,
        batch_id: int,
        metadata: dict[str, str] | None = None,
    ) -> bool:
        """Commit the tasks' files of ``table`` (named ``name``) under (app id, batch id), with
        ``metadata``; whether it committed (not when the table holds the batch, or no task
        wrote a file)."""
        mine = files_of(files, name)
        if not mine:
            return False
        with self._commit_turn:
            return table.commit(mine, app_id=app_id, version=batch_id, metadata=metadata)

    def start_maintenance(self, watermark_ms: int) -> bool:
        """Start a pass of the periodic work now due (:meth:`maintain`) in a thread of its own,
        after a micro-batch ran under ``watermark_ms``, unless a pass is still running (what
        falls due meanwhile waits for the next batch after it); returns whether one started.
        The next micro-batches commit while it runs: the stream never waits for it."""
        if self._pass.running:
            return False
        roll_up = watermark_ms > 0 and self._rollup.due()
        maintenance = self.maintenance_due.due()
        if not (roll_up or maintenance):
            return False
        return self._pass.start(
            self.maintain, watermark_ms, roll_up=roll_up, maintenance=maintenance
        )

    def join_maintenance(self, timeout: float | None = None) -> bool:
        """Wait for the running maintenance pass (if any); returns whether none is running."""
        return self._pass.join(timeout)

    def maintain(
        self, watermark_ms: int, *, roll_up: bool = True, maintenance: bool = True
    ) -> None:
        """One pass, on the pass's own table handles: ``roll_up`` the buckets the watermark
        closed and compact the micro-batch files of the minutes past, then expire the
        attribution state of closed buckets (every ``rollup_seconds``); ``maintenance``: delete
        what the batch layer covers and vacuum (every ``maintenance_seconds``). Never stops the
        stream: a failure is logged and tried again next time."""
        clock = PhaseClock()
        if roll_up:
            self._roll_up(closed_before(watermark_ms), clock)
            self._expire_state(watermark_ms)
            clock.lap("state_expiry")
        if maintenance:
            self._maintenance()
            clock.lap("maintenance")
        self.last_pass = dict(clock.ms)
        log.info("maintenance pass (ms): %s", json.dumps(clock.ms))

    def _roll_up(self, end: dt.datetime, clock: PhaseClock) -> None:
        """The roll-up, then the minute compaction (a lap of ``clock`` each)."""
        try:
            if not self._rolled_up_known:
                self._rolled_up_before = self.kept_ctr.rolled_up_before()
                self._rolled_up_known = True
            done = self.kept_ctr.roll_up(self._rolled_up_before, end)
            if done is not None:
                self._rolled_up_before = end
                log.info(
                    "speed/ctr roll-up of buckets before %s: %d rows -> %d",
                    f"{end:%Y-%m-%d %H:%M}", done.rows_before, done.rows_after,
                )  # fmt: skip
            clock.lap("rollup")
            compacted = self.kept_ctr.compact_minutes(self._rolled_up_before)
            clock.lap("compaction")
            if compacted:
                log.info("speed/ctr: micro-batch files compacted, %d minute(s)", compacted)
        except Exception as exc:  # maintenance must never stop the stream
            clock.lap("rollup")
            log.warning("speed/ctr roll-up failed (will retry): %s", exc)

    def _expire_state(self, watermark_ms: int) -> None:
        try:
            expired = state.expire(
                self.state_root, self.lake.object_store, open_from_ms(watermark_ms)
            )
            if expired:
                log.info("attribution state: %d file(s) of closed buckets deleted", expired)
        except Exception as exc:  # maintenance must never stop the stream
            log.warning("attribution state expiry failed (will retry): %s", exc)

    def _maintenance(self) -> None:
        try:
            # What the published version covers: the serving layer answers those buckets from
            # the batch layer, so their speed rows are never read again.
            published = read_registry(self.lake).published("ctr")
            coverage = read_runs(self.lake).of(published.key)
            with self._commit_turn:
                pruned = self.kept_ctr.delete_covered(coverage)
            merged = self.kept_ctr.merge_closed_hours(self._rolled_up_before)
            vacuumed = self.kept_ctr.vacuum()
            log.info(
                "speed/ctr maintenance: %d covered rows deleted, %d closed hours merged to a "
                "file each, %d files vacuumed",
                pruned, merged, vacuumed,
            )  # fmt: skip
            # speed/late is read for the minutes no batch run covered yet (drift): the covered
            # ones are forgotten, the rest (a file per batch with late events) compacted.
            with self._commit_turn:
                late_pruned = self.kept_late.delete_covered(coverage)
            log.info("speed/late maintenance: %d covered rows deleted, %s",
                     late_pruned, self.kept_late.maintain())  # fmt: skip
        except Exception as exc:  # maintenance must never stop the stream
            log.warning("speed/ctr maintenance failed (will retry later): %s", exc)


def reset(lake: LakeSettings, settings: SpeedSettings) -> None:
    """Forget the speed job's progress: empty speed/ctr and speed/late, delete the checkpoint
    (the attribution state with it)."""
    retention = settings.vacuum_retention_hours
    for table in (SPEED_CTR, SPEED_LATE):
        SpeedTable(
            table.path(lake), lake.object_store, table.schema, retention_hours=retention
        ).reset()
    Checkpoint(lake.checkpoint(settings.checkpoint_name), lake.object_store).delete()


def run(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: SpeedSettings,
    available_now: bool = False,
    on_progress: Callable[[StreamProgress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Run the speed job until caught up (available_now) or told to stop; returns rows read."""
    writer = SpeedBatchWriter(lake, lake.checkpoint(settings.checkpoint_name), settings)
    query = build_query(
        spark,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
        writer=writer,
    )
    lag = KafkaLag(kafka)

    def report(progress: StreamProgress) -> None:
        clock = PhaseClock()
        behind = lag.behind(progress.end_offsets)
        # The watermark and the invalid records are the job's own (the tasks parse the
        # records; no Spark operator sees the events).
        counts = writer.phases.counts_of(progress)
        watermark = writer.watermarks.get(progress.batch_id)
        progress = dataclasses.replace(
            progress,
            offsets_behind=behind if behind is not None else progress.offsets_behind,
            watermark=EPOCH + dt.timedelta(milliseconds=watermark) if watermark else None,
            metrics={f"{OBSERVATION}.{k}": counts.get(k, 0) for k in ("records", "invalid")},
            counts=counts,
        )
        clock.lap("lag")
        # Where the batch's time went: Spark's phases of the trigger (addBatch is the callback),
        # the callback's own phases, and (from this report) asking the lag, writing the status
        # (which keeps the batch's counts beside its phases, as `ctr speed status` shows them).
        phases = {**writer.phases.of(progress), **clock.ms}
        write_status(
            lake, progress, phases={**phases, **counts}, watermark_delay_ms=settings.watermark_ms
        )
        clock.lap("status")
        log.info(
            "batch %d: %d rows, %.0f rows/s in, %.0f rows/s processed, %d ms, %s offsets behind",
            progress.batch_id, progress.input_rows, progress.input_rows_per_second,
            progress.processed_rows_per_second, progress.batch_duration_ms,
            "?" if progress.offsets_behind is None else progress.offsets_behind,
        )  # fmt: skip
        phases.update(clock.ms)
        log.info("batch %d phases (ms): %s; counts: %s", progress.batch_id, json.dumps(phases),
                 json.dumps(counts))  # fmt: skip
        if on_progress is not None:
            on_progress(dataclasses.replace(progress, phases_ms=phases))

    try:
        return drive(query, "the speed job", on_progress=report, should_stop=should_stop)
    finally:
        lag.close()
        # A pass under way finishes (its files committed, not left for VACUUM); a stopped job
        # waits for it a bounded while.
        if not writer.join_maintenance(timeout=MAINTENANCE_JOIN_SECONDS):
            log.warning("the maintenance pass was still running %.0f s after the stream ended",
                        MAINTENANCE_JOIN_SECONDS)  # fmt: skip
