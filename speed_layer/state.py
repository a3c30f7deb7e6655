"""The speed layer's attribution state, kept per Kafka partition by the Spark tasks that count
that partition, and persisted beside the speed job's checkpoint so that it survives a restart.

Why per partition: clicks and their impressions share the Kafka key (the impression id), so the
producer puts them in the same partition, and the Kafka source gives each partition's records
to one task of the micro-batch (whole partitions: the job coalesces them, never splits them).
A task can attribute its partition's clicks with no shuffle and no other task's state. (A topic
whose partition count changes re-keys later records: until the open buckets close, a click
whose impression went to the other partition counts as an orphan.)

Why not Spark's own state (``transformWithStateInPandas`` keyed by impression): every event
would cross a shuffle and reach Python one key at a time, a call per impression, where a task
attributes a whole micro-batch of its partition in a few vectorised steps
(:class:`speed_layer.attribution.Attribution`).

How it is kept, like Spark's HDFS-backed state store (a change file per version, here per
micro-batch and partition): the task that attributes a micro-batch's on-time events of a
partition writes them, as they came, to ``{root}/partition={p}/{batch:020}-{max bucket ms}.arrow``
(Arrow IPC, zstd) with the batch's open-bucket boundary. Replaying those files in batch order
rebuilds the state exactly: the attribution is a function of the events and the boundaries.
A file whose newest bucket is closed is never needed again (a click is credited only to an
impression at or before it, so everything it touched is closed too): rebuilds skip it and the
driver deletes it (:func:`expire`). The files a micro-batch's tasks wrote before its commit are
the same when Spark replays it (same records, same watermark), and overwritten.

Snapshots bound a cold start (a new Python worker, a driver restarted on another host): every
``snapshot_every`` change files, the task writes the partition's whole state
(``snapshot-{batch:020}.arrow``, :meth:`Attribution.to_table`); a rebuild reads the newest
snapshot before the batch it needs and the change files after it: at most one snapshot and
``snapshot_every`` change files per partition, however long the job has run. The driver keeps the
two newest snapshots of each partition (a replay of the last batch may need the older one) and
deletes the change files they hold.

With ``CHECKPOINT_ROOT`` on the object store, all of it is there, written and read by whichever
executor runs the partition's task: nothing lands on an executor's own disk.

Each Python worker holds the states it has used in memory, with the batch each reached; a task
whose partition state is not at the partition's previous micro-batch (another worker took it,
or the process restarted) reads the files it lacks. The driver tells the tasks each partition's
previous micro-batch (from the tasks' answers), so a worker that is up to date lists nothing.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings
from speed_layer.attribution import BUCKET_MS, EVENTS_SCHEMA, Attribution

# Where the open-bucket boundary a file's batch ran under is kept (schema metadata).
_OPEN_FROM: Final = b"ctr.openFromMs"
_NAME: Final = re.compile(r"^(\d{20})-(-?\d+)\.arrow$")
_SNAPSHOT: Final = re.compile(r"^snapshot-(\d{20})\.arrow$")
_IPC: Final = pa.ipc.IpcWriteOptions(compression="zstd")
# Change files between two snapshots of a partition's state (a cold start reads at most one
# snapshot and this many change files): two minutes of one-second micro-batches.
SNAPSHOT_EVERY: Final = 120


@dataclass
class _Held:
    """A partition's state in this worker: the attribution, as of ``batch``, and the change
    files since the newest snapshot it knows of."""

    batch: int
    attribution: Attribution
    since_snapshot: int = 0


# Per Python worker: (state root, query id, partition) -> state. Spark reuses its Python
# workers between tasks, so a worker that counts a partition again finds it here.
_HELD: dict[tuple[str, str, int], _Held] = {}


@dataclass(frozen=True)
class Attributed:
    """What :func:`attribute` did for one partition of one micro-batch."""

    increments: pa.Table  # speed_layer.attribution.INCREMENTS_SCHEMA
    open_impressions: int  # the partition's state after the batch
    saved: bool  # whether the batch changed the state (a file written)
    files_read: int  # files read to bring the state up to date (snapshots included)
    snapshotted: bool = False  # whether the batch wrote a snapshot of the state


@dataclass(frozen=True)
class StateFile:
    batch: int
    newest_bucket_ms: int
    path: str
    partition: int = -1


@dataclass(frozen=True)
class Snapshot:
    batch: int  # the state after this micro-batch
    path: str
    partition: int = -1


def attribute(  # noqa: PLR0913, PLR0917
    root: str,
    store: ObjectStoreSettings,
    query: str,
    partition: int,
    batch: int,
    events: pa.Table,
    open_from_ms: int,
    previous: int | None,
    window: dt.timedelta,
    *,
    snapshot_every: int = SNAPSHOT_EVERY,
) -> Attributed:
    """Attribute micro-batch ``batch``'s ``events`` of Kafka ``partition``
    (:data:`speed_layer.attribution.EVENTS_SCHEMA`, in offset order) against the partition's
    state, and save them as the batch's change to it, under ``root`` (on ``store`` if it is
    an object-store URI).

    ``previous``: the last micro-batch that changed this partition's state, if the driver knows
    it (None: read the partition's files to find out). ``open_from_ms``: the start of the first
    open bucket under the batch's watermark. ``snapshot_every``: change files between two
    snapshots of the state."""
    key = (root, query, partition)
    held = _HELD.get(key)
    fresh = held is not None and held.batch < batch and previous == held.batch
    files_read = 0
    if not fresh:
        held, files_read = _caught_up(root, store, partition, batch, open_from_ms, held, window)
    assert held is not None
    on_time = _on_time(events, open_from_ms)
    increments = held.attribution.process(on_time, open_from_ms)
    saved = on_time.num_rows > 0
    snapshotted = False
    if saved:
        _save(root, store, partition, batch, on_time, open_from_ms)
        held.batch = batch
        held.since_snapshot += 1
        if held.since_snapshot >= snapshot_every:
            _save_snapshot(root, store, partition, batch, held.attribution)
            held.since_snapshot, snapshotted = 0, True
    _HELD[key] = held
    return Attributed(increments, held.attribution.impressions, saved, files_read, snapshotted)


def _on_time(events: pa.Table, open_from_ms: int) -> pa.Table:
    """The events the attribution takes (impressions and clicks of open buckets), in its
    schema."""
    table = events.select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
    buckets = pc.multiply(pc.divide(table["event_ms"], BUCKET_MS), BUCKET_MS)
    kind = table["event_type"]
    wanted = pc.and_(
        pc.greater_equal(buckets, open_from_ms),
        pc.or_(pc.equal(kind, "impression"), pc.equal(kind, "click")),
    )
    return table.filter(pc.fill_null(wanted, False))


def _caught_up(  # noqa: PLR0917
    root: str,
    store: ObjectStoreSettings,
    partition: int,
    batch: int,
    open_from_ms: int,
    held: _Held | None,
    window: dt.timedelta,
) -> tuple[_Held, int]:
    """The partition's state as of the last batch before ``batch``: ``held`` brought up to date
    from the newest snapshot after it (if any) and the change files after that, or (``held``
    None or not before ``batch``: a replay) rebuilt likewise from scratch."""
    if held is None or held.batch >= batch:
        held = _Held(-1, Attribution(window))
    changes, snapshots = _listing(root, store, partition)
    filesystem, _ = arrow_filesystem(root, store)
    read = 0
    usable = [s for s in snapshots if held.batch < s.batch < batch]
    if usable:
        newest = usable[-1]
        with filesystem.open_input_file(newest.path) as source:
            table = pa.ipc.open_file(source).read_all()
        held = _Held(newest.batch, Attribution.from_table(table, window))
        read += 1
    files = [
        f for f in changes if held.batch < f.batch < batch and f.newest_bucket_ms >= open_from_ms
    ]
    for f in files:
        with filesystem.open_input_file(f.path) as source:
            table = pa.ipc.open_file(source).read_all()
        metadata = table.schema.metadata or {}
        held.attribution.process(table, int(metadata[_OPEN_FROM]))
        held.batch = f.batch
    held.since_snapshot += len(files)
    return held, read + len(files)


def _save(  # noqa: PLR0917
    root: str,
    store: ObjectStoreSettings,
    partition: int,
    batch: int,
    events: pa.Table,
    open_from_ms: int,
) -> None:
    newest = int(np.max(events["event_ms"].to_numpy())) // BUCKET_MS * BUCKET_MS
    filesystem, base = arrow_filesystem(root, store)
    directory = f"{base.rstrip('/')}/partition={partition}"
    filesystem.create_dir(directory, recursive=True)
    table = events.replace_schema_metadata({_OPEN_FROM: str(open_from_ms).encode()})
    target = f"{directory}/{batch:020d}-{newest}.arrow"
    with (
        filesystem.open_output_stream(target) as sink,
        pa.ipc.new_file(sink, table.schema, options=_IPC) as writer,
    ):
        writer.write_table(table)


def _save_snapshot(
    root: str, store: ObjectStoreSettings, partition: int, batch: int, attribution: Attribution
) -> None:
    filesystem, base = arrow_filesystem(root, store)
    target = f"{base.rstrip('/')}/partition={partition}/snapshot-{batch:020d}.arrow"
    table = attribution.to_table()
    # One PUT on an object store; on a local disk a rename, so a reader never sees half of it.
    scratch = target if not isinstance(filesystem, pafs.LocalFileSystem) else f"{target}.tmp"
    with (
        filesystem.open_output_stream(scratch) as sink,
        pa.ipc.new_file(sink, table.schema, options=_IPC) as writer,
    ):
        writer.write_table(table)
    if scratch != target:
        filesystem.move(scratch, target)


def _listing(
    root: str, store: ObjectStoreSettings, partition: int | None = None
) -> tuple[list[StateFile], list[Snapshot]]:
    """The change files and the snapshots (of one ``partition``, or of all), in batch order:
    one listing."""
    filesystem, base = arrow_filesystem(root, store)
    base = base.rstrip("/")
    directory = base if partition is None else f"{base}/partition={partition}"
    selector = pafs.FileSelector(directory, allow_not_found=True, recursive=partition is None)
    changes, snapshots = [], []
    for info in filesystem.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        owner = _partition_of(info.path) if partition is None else partition
        if match := _NAME.match(info.base_name):
            changes.append(StateFile(int(match[1]), int(match[2]), info.path, owner))
        elif match := _SNAPSHOT.match(info.base_name):
            snapshots.append(Snapshot(int(match[1]), info.path, owner))
    changes.sort(key=lambda f: (f.batch, f.path))
    snapshots.sort(key=lambda s: (s.batch, s.path))
    return changes, snapshots


def _partition_of(path: str) -> int:
    folder = path.rsplit("/", 2)[-2]
    return int(folder.removeprefix("partition=")) if folder.startswith("partition=") else -1


def state_files(
    root: str, store: ObjectStoreSettings, partition: int | None = None
) -> list[StateFile]:
    """The state's change files (of one ``partition``, or of all), in batch order."""
    return _listing(root, store, partition)[0]


def snapshots(
    root: str, store: ObjectStoreSettings, partition: int | None = None
) -> list[Snapshot]:
    """The state's snapshots (of one ``partition``, or of all), in batch order."""
    return _listing(root, store, partition)[1]


def expire(root: str, store: ObjectStoreSettings, open_from_ms: int) -> int:
    """Delete what no rebuild reads again: the change files whose newest bucket is before
    ``open_from_ms`` (closed), and per partition the snapshots but the two newest and the
    change files the older of those holds. Returns how many files went. The driver's maintenance
    pass calls it beside the micro-batches: what it deletes, no task of a running batch reads
    (it reads a partition's newest snapshot and the change files after it, of open buckets)."""
    filesystem, _ = arrow_filesystem(root, store)
    changes, snaps = _listing(root, store)
    kept: dict[int, list[Snapshot]] = {}
    for snapshot in snaps:
        kept.setdefault(snapshot.partition, []).append(snapshot)
    gone = [s.path for every in kept.values() for s in every[:-2]]
    floor = {p: every[-2].batch for p, every in kept.items() if len(every) >= 2}
    gone += [
        f.path
        for f in changes
        if f.newest_bucket_ms < open_from_ms or f.batch <= floor.get(f.partition, -1)
    ]
    for path in gone:
        filesystem.delete_file(path)
    return len(gone)


def forget() -> None:
    """Drop this worker's states (tests: a worker that starts empty)."""
    _HELD.clear()
