"""The archiver: every Kafka record, exactly once, in the master dataset.

A Structured Streaming query from the event topic. Each micro-batch is one Spark job, a task per
core: the task parses its Kafka records with the ingest validator, writes the valid events as
Parquet files under ``master/events`` (partitioned by ``event_date``) and the rest under
``master/rejected`` with the reason and the raw bytes, counts its valid events per minute bucket
and dimensions, and returns only the files' descriptions and the counts
(:mod:`lake.data_files`). The driver then commits each table's files with delta-rs, one commit
per table idempotent under (query id, batch id) (application transactions,
:mod:`lake.append_table`): after a crash Spark replays the unfinished batch with the same
offsets and whatever was already committed is skipped, so every (partition, offset) lands
exactly once (files of an attempt that never got its commit are named by no commit; VACUUM
removes them). A third commit, idempotent the same way, appends the batch's counts to
``master/arrivals`` with the master/events version that holds them: how the serving layer and
`ctr batch --stale` learn that a bucket a batch run covered received events since
(:mod:`lake.coverage.staleness`).

A batch is at most ``ARCHIVER_MAX_OFFSETS_PER_TRIGGER`` records (default 1,000,000); the rows
stay in the tasks that parsed them, on the executors.

The archiver keeps its three tables small itself, every ``ARCHIVER_MAINTENANCE_SECONDS``
(default 900): a commit every few seconds leaves a small file per commit and partition, so it
compacts them and vacuums past ``LAKE_VACUUM_RETENTION_HOURS``
(:meth:`lake.append_table.AppendTable.maintain`: the partitions written since the last pass,
a lite VACUUM, and a full one at the first pass after a start and then every
``ARCHIVER_FULL_VACUUM_SECONDS``, default a day). The pass runs in a thread of its own, off the
commit path: micro-batches go on committing while it compacts (its commits change no data,
and an append never conflicts with them; the batch job's deletes from ``master/arrivals`` may:
that table's pass is then retried at the next period). One pass at a time; a pass still
running when the next is due is left to finish.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final, Protocol

import pyarrow as pa

from events.records import EVENTS_SCHEMA, REJECTED_SCHEMA, one_task_per_core, parse
from lake.append_table import AppendTable, Maintained
from lake.arrivals import arrival_rows, arrivals_table
from lake.catalog import MASTER_EVENTS, MASTER_REJECTED
from lake.checkpoints import Checkpoint
from lake.data_files import FILES_SCHEMA, DataFile, files_of, write_files
from lake.settings import LakeSettings
from master_dataset.settings import ArchiverSettings
from runtime.connectors import ARCHIVER_GROUP, read_kafka
from runtime.kafka_settings import KafkaSettings
from runtime.object_store import ObjectStoreSettings
from runtime.streaming import (
    MAINTENANCE_JOIN_SECONDS,
    BackgroundPass,
    Periodic,
    PhaseClock,
    RecentPhases,
    StreamProgress,
    drive,
)
from views.ctr import ctr_arrow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ctr.archiver")

# What a task returns: a row per data file written, and one row with its counts (the
# arrivals, as an Arrow IPC stream) and its own phases (ms, JSON).
TASK_SCHEMA: Final = pa.schema([*FILES_SCHEMA, ("counts", pa.binary()), ("task_ms", pa.string())])
_COUNTS: Final = "counts"
# Columns with few distinct values, dictionary-encoded in the data files (the ids are not:
# encoding them costs a third of the write and saves nothing).
_EVENTS_DICTIONARY: Final = (
    "event_type", "ad_id", "campaign_id", "site_id", "country", "device_type",
    "schema_version", "kafka_partition",
)  # fmt: skip
_REJECTED_DICTIONARY: Final = ("reason", "kafka_topic", "kafka_partition")


def build_query(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: ArchiverSettings,
    available_now: bool = False,
    batch_writer: ArchiveBatchWriter | None = None,
) -> StreamingQuery:
    """Start the archiving query (it runs until stopped, or until caught up if available_now)."""

    checkpoint = lake.checkpoint(settings.checkpoint_name)
    raw = read_kafka(
        spark,
        kafka,
        stream=True,
        group_prefix=ARCHIVER_GROUP,
        startingOffsets=settings.starting_offsets,
        maxOffsetsPerTrigger=str(settings.max_offsets_per_trigger),
        failOnDataLoss=str(settings.fail_on_data_loss).lower(),
    )
    writer = raw.writeStream.foreachBatch(
        batch_writer or ArchiveBatchWriter(lake, checkpoint, settings)
    )
    writer = writer.option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return writer.queryName("ctr-archiver").start()


class ArchiveBatchWriter:
    """foreachBatch function over the Kafka records of a micro-batch: one Spark job, a task per
    core, parses them and writes the tables' files (:func:`archive_records`); then the driver
    commits master/events, master/rejected and master/arrivals, each in one delta-rs commit
    idempotent under (query id, batch id) (:mod:`lake.append_table`). A table with nothing to
    add gets no commit; a table that holds the batch already (a replay) gets no files. Every
    ``settings.maintenance_seconds`` it compacts and vacuums the three tables.
    ``phases`` keeps, for the last few batches, the milliseconds of each step (``task.*``:
    summed over the batch's tasks, which run side by side)."""

    def __init__(self, lake: LakeSettings, checkpoint: str, settings: ArchiverSettings) -> None:
        self.checkpoint = Checkpoint(checkpoint, lake.object_store)
        self.settings = settings
        # The first pass a minute after the start (see Periodic), with a full VACUUM.
        self.maintenance_due = Periodic(self.settings.maintenance_seconds, first_after_s=60)
        self.full_vacuum_due = Periodic(self.settings.full_vacuum_seconds, first_after_s=0)
        self._maintenance = BackgroundPass("archiver-maintenance")
        self.phases = RecentPhases()
        # The lake's object store, given to the tasks too (in their closure).
        self.store = lake.object_store
        self.events = AppendTable(
            MASTER_EVENTS.path(lake),
            self.store,
            EVENTS_SCHEMA,
            partition_by=MASTER_EVENTS.partition_by,
            properties=lake.retention(MASTER_EVENTS.name),
        )
        self.rejected = AppendTable(
            MASTER_REJECTED.path(lake),
            self.store,
            REJECTED_SCHEMA,
            properties=lake.retention(MASTER_REJECTED.name),
        )
        self.arrivals = arrivals_table(lake)
        # What a pass maintains: the same tables (each pass opens its own handles).
        self.maintained: list[Maintainable] = [self.events, self.rejected, self.arrivals]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        clock = PhaseClock()
        app_id = f"ctr-archiver-{self.checkpoint.query_id()}"
        events_due = not self.events.committed(app_id, batch_id)
        rejected_due = not self.rejected.committed(app_id, batch_id)
        # While a data table may still need the batch the job runs anyway, and the arrivals
        # append checks for itself; only when both hold it is master/arrivals asked. (A batch
        # with no rejected records never commits master/rejected: its replay reruns the job.)
        arrivals_due = events_due or rejected_due or not self.arrivals.committed(app_id, batch_id)
        clock.lap("replay_check")
        if not arrivals_due:
            log.info("batch %d already archived (a replay): skipped", batch_id)
            self.phases.record(batch_id, clock.ms)
            return
        task = functools.partial(
            archive_records,
            events_root=self.events.path if events_due else None,
            rejected_root=self.rejected.path if rejected_due else None,
            store=self.store,
        )
        answers = one_task_per_core(batch).mapInArrow(task, from_arrow_schema(TASK_SCHEMA))
        rows = answers.toArrow().to_pylist()
        clock.lap("tasks")
        files = [r for r in rows if r["table"] != _COUNTS]
        if events_due:
            self._commit(self.events, files, MASTER_EVENTS.name, app_id, batch_id)
        clock.lap("events_commit")
        if rejected_due:
            self._commit(self.rejected, files, MASTER_REJECTED.name, app_id, batch_id)
        clock.lap("rejected_commit")
        counted = [r for r in rows if r["table"] == _COUNTS]
        # The tasks' counts, not summed: readers of master/arrivals sum per bucket anyway, and
        # two tasks' events rarely share a bucket and dimensions (summing saved <1 % of rows).
        parts = [_ipc_table(r["counts"]) for r in counted]
        counts = pa.concat_tables(parts) if parts else None
        if arrivals_due and counts is not None and counts.num_rows:
            # Read after the events commit (a replay's too): never below the commit's version.
            version = self.events.version()
            assert version is not None
            arrivals = arrival_rows(
                counts,
                events_version=version,
                batch_id=batch_id,
                archived_at=dt.datetime.now(dt.UTC),
            )
            self.arrivals.append(arrivals, app_id=app_id, version=batch_id)
        clock.lap("arrivals_write")
        for r in counted:
            for name, ms in json.loads(r["task_ms"]).items():
                clock.ms[f"task.{name}"] = clock.ms.get(f"task.{name}", 0) + ms
        if self.maintenance_due.due():
            self.start_maintenance()
            clock.lap("maintenance_start")
        # The batch's valid and rejected records, from the files' statistics (the metrics').
        counts = {
            name: sum(_records(r) for r in files if r["table"] == table)
            for name, table in (("events", MASTER_EVENTS.name), ("rejected", MASTER_REJECTED.name))
        }
        self.phases.record(batch_id, clock.ms, counts)

    def start_maintenance(self) -> bool:
        """Start a maintenance pass in its own thread (:meth:`maintain`), unless one is still
        running; returns whether it started."""
        if self._maintenance.running:
            log.info("maintenance: the last pass is still running; this one is skipped")
            return False
        return self._maintenance.start(self.maintain, full_vacuum=self.full_vacuum_due.due())

    def join_maintenance(self, timeout: float | None = None) -> bool:
        """Wait for the running maintenance pass (if any); returns whether none is running."""
        return self._maintenance.join(timeout)

    def maintain(self, *, full_vacuum: bool = True) -> None:
        """Compact and vacuum master/events, master/rejected and master/arrivals, one pass; a
        table that fails (a commit conflict with the batch job's clean-up of master/arrivals)
        is logged and left for the next period: maintenance never stops the stream."""
        for table in self.maintained:
            try:
                log.info("maintenance: %s", table.maintain(full_vacuum=full_vacuum))
            except Exception as exc:
                log.warning("maintenance of %s failed (retried next period): %s", table.path, exc)

    @staticmethod
    def _commit(
        table: AppendTable, files: list[dict[str, object]], name: str, app_id: str, batch_id: int
    ) -> None:
        mine = files_of(files, name)
        if mine:
            table.commit(mine, app_id=app_id, version=batch_id)


class Maintainable(Protocol):
    """A table the archiver maintains (:class:`lake.append_table.AppendTable`)."""

    path: str

    def maintain(self, *, full_vacuum: bool = True) -> Maintained: ...


def archive_records(
    batches: Iterator[pa.RecordBatch],
    *,
    events_root: str | None,
    rejected_root: str | None,
    store: ObjectStoreSettings,
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function, one Spark task's share of a micro-batch (Kafka source columns):
    parse every record, write the valid events' files under ``events_root`` and the rejected
    records' under ``rejected_root`` (None: that table holds the batch already; both on the
    lake's object store ``store`` when it is there), count the valid events
    (:func:`views.ctr.ctr_arrow`). Yields a row per file and one with the counts."""
    clock = PhaseClock()
    parsed = [parse(b) for b in batches]
    clock.lap("parse")
    if not parsed:
        return
    events = pa.concat_tables([p.events for p in parsed])
    rejected = pa.concat_tables([p.rejected for p in parsed])
    clock.lap("concat")
    files: list[DataFile] = []
    if events_root is not None:
        files += write_files(
            MASTER_EVENTS.name,
            events_root,
            store,
            events,
            MASTER_EVENTS.partition_by,
            dictionary=_EVENTS_DICTIONARY,
        )
    if rejected_root is not None:
        files += write_files(
            MASTER_REJECTED.name, rejected_root, store, rejected, dictionary=_REJECTED_DICTIONARY
        )
    clock.lap("write")
    counts = _ipc_bytes(ctr_arrow(events))
    clock.lap("count")
    answer: list[dict[str, object]] = [dict(f) for f in files]
    answer.append({"table": _COUNTS, "counts": counts, "task_ms": json.dumps(clock.ms)})
    yield pa.RecordBatch.from_pylist(answer, schema=TASK_SCHEMA)


def _records(file: dict[str, object]) -> int:
    """A written file's records, from its Delta statistics."""
    stats = json.loads(str(file["stats"] or "{}"))
    return int(stats.get("numRecords", 0))


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _ipc_table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def run(
    spark: SparkSession,
    *,
    kafka: KafkaSettings,
    lake: LakeSettings,
    settings: ArchiverSettings,
    available_now: bool = False,
    on_progress: Callable[[StreamProgress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Run the archiver until caught up (available_now) or told to stop; returns rows archived.
    Each batch's phases (ms) are logged, and reach ``on_progress`` as ``progress.phases_ms``,
    its counts of events and rejected records as ``progress.counts``."""
    writer = ArchiveBatchWriter(lake, lake.checkpoint(settings.checkpoint_name), settings)
    query = build_query(
        spark,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
        batch_writer=writer,
    )

    def report(progress: StreamProgress) -> None:
        phases = writer.phases.of(progress)
        log.info("batch %d phases (ms): %s", progress.batch_id, json.dumps(phases))
        if on_progress is not None:
            counts = writer.phases.counts_of(progress)
            on_progress(dataclasses.replace(progress, phases_ms=phases, counts=counts))

    try:
        return drive(query, "the archiver", on_progress=report, should_stop=should_stop)
    finally:
        # A pass under way finishes its commits (one left mid-way only leaves files no
        # commit names, for the next full VACUUM).
        if not writer.join_maintenance(timeout=MAINTENANCE_JOIN_SECONDS):
            log.warning("maintenance: a pass still running at the stop was left")
