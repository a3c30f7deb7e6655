"""Our attribution state (:mod:`speed_layer.state`) over the benchmark's micro-batches, as the
speed job's tasks drive it: per micro-batch and Kafka partition, ``state.attribute`` with the
batch's open-bucket boundary and the partition's previous batch (what the driver tells the
tasks), the driver's ``state.expire`` every ``rollup_seconds`` of batches; then a cold start
(a worker that holds nothing: ``state.forget``, and a driver that knows no previous batch) on
the next batch.

Where the time goes, measured around the module's own steps without changing them: the read
(``_caught_up``: a listing, the snapshot and change files a worker lacks), the change file's
write (``_save``), the snapshot's write (``_save_snapshot``), and the rest of the call (the
on-time filter and the vectorised attribution). The store's requests are counted by a wrapper
around the filesystem the module opens (listings, objects read with their bytes, objects
written, directories made, deletions). Not timed: reading the batch file and hashing the ids
(``tasks.attribution_events``: the job does it either way), done before the clock starts.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from bench.state_traffic import BatchPlan
from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings
from speed_layer import state
from speed_layer.attribution import MEASURES
from speed_layer.job import ATTRIBUTION
from speed_layer.tasks import attribution_events

EXPIRE_EVERY: Final = 60  # batches between two expiries (SPEED_ROLLUP_SECONDS at a 1-s trigger)
BucketTotals = dict[int, list[int]]  # bucket start (ms) -> attributed, orphan, repeat clicks


@dataclass
class Requests:
    """What the state asked of the store."""

    listings: int = 0
    reads: int = 0
    bytes_read: int = 0
    writes: int = 0
    dirs: int = 0
    dirs_ms: float = 0.0  # of the writes' time: making the "directory" (a round trip on S3)
    deletes: int = 0

    def since(self, before: Requests) -> Requests:
        return Requests(**{k: getattr(self, k) - getattr(before, k) for k in self.__dict__})


class CountingFileSystem:
    """A pyarrow filesystem that counts the requests made through it (what speed_layer.state
    calls; everything else is passed on)."""

    def __init__(self, inner: pafs.FileSystem, requests: Requests) -> None:
        self._inner = inner
        self.requests = requests

    def get_file_info(self, what: Any) -> Any:
        self.requests.listings += 1
        return self._inner.get_file_info(what)

    def open_input_file(self, path: str) -> Any:
        source = self._inner.open_input_file(path)
        self.requests.reads += 1
        self.requests.bytes_read += source.size()
        return source

    def open_output_stream(self, path: str) -> Any:
        self.requests.writes += 1
        return self._inner.open_output_stream(path)

    def create_dir(self, path: str, *, recursive: bool = True) -> None:
        self.requests.dirs += 1
        started = time.perf_counter()
        self._inner.create_dir(path, recursive=recursive)
        self.requests.dirs_ms += (time.perf_counter() - started) * 1000

    def delete_file(self, path: str) -> None:
        self.requests.deletes += 1
        self._inner.delete_file(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class Phases:
    """Milliseconds of one ``state.attribute`` call, by step."""

    read: float = 0.0
    write: float = 0.0
    snapshot: float = 0.0


class Instrumented:
    """While entered: speed_layer.state's steps timed into :attr:`phases` and its store
    requests counted into :attr:`requests`."""

    def __init__(self) -> None:
        self.phases = Phases()
        self.requests = Requests()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Instrumented:
        requests = self.requests

        def counting(location: str, store: ObjectStoreSettings) -> tuple[Any, str]:
            filesystem, path = arrow_filesystem(location, store)
            return CountingFileSystem(filesystem, requests), path

        self._patch("arrow_filesystem", counting)
        self._patch("_caught_up", self._timed(state._caught_up, "read"))
        self._patch("_save", self._timed(state._save, "write"))
        self._patch("_save_snapshot", self._timed(state._save_snapshot, "snapshot"))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _patch(self, name: str, replacement: Callable[..., Any]) -> None:
        original = getattr(state, name)
        setattr(state, name, replacement)
        self._stack.callback(setattr, state, name, original)

    def _timed(self, function: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent = (time.perf_counter() - started) * 1000
                setattr(self.phases, phase, getattr(self.phases, phase) + spent)

        return timed


@dataclass
class Call:
    """One ``state.attribute`` call: its milliseconds by step, and what it did."""

    batch: int
    partition: int
    total_ms: float
    read_ms: float
    write_ms: float
    snapshot_ms: float
    objects_read: int
    bytes_read: int
    objects_written: int
    snapshotted: bool

    @property
    def attribute_ms(self) -> float:
        return self.total_ms - self.read_ms - self.write_ms - self.snapshot_ms


@dataclass
class OursRun:
    """What a run of our store over the micro-batches left."""

    snapshot_every: int
    calls: list[Call] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)  # per batch, its partitions' calls summed
    expiries_ms: list[float] = field(default_factory=list)
    requests: Requests = field(default_factory=Requests)  # over the warm batches
    store_samples: list[tuple[int, int]] = field(default_factory=list)  # (objects, bytes)
    totals: dict[int, BucketTotals] = field(default_factory=dict)  # per batch
    cold: list[Call] = field(default_factory=list)  # the cold start, per partition
    cold_requests: Requests = field(default_factory=Requests)
    cold_listed: tuple[int, int] = (0, 0)  # the store's objects and bytes at the cold start


def run(
    plans: list[BatchPlan],
    *,
    root: str,
    store: ObjectStoreSettings,
    partitions: int,
    snapshot_every: int,
    label: str,
) -> OursRun:
    """Our store under ``root`` over every batch of ``plans`` but the last, then a cold start on
    the last."""
    result = OursRun(snapshot_every)
    query = f"bench-{label}"
    previous: dict[int, int] = {}  # the driver's knowledge: partition -> last batch that changed it
    state.forget()
    warm, last = plans[:-1], plans[-1]
    started = time.monotonic()
    with Instrumented() as probe:
        for plan in warm:
            events = _events(plan)
            calls = [
                _call(
                    probe,
                    plan,
                    partition,
                    events,
                    root,
                    store,
                    query,
                    previous,
                    snapshot_every,
                    result,
                )
                for partition in range(partitions)
            ]
            result.calls += calls
            result.batch_ms.append(sum(c.total_ms for c in calls))
            if plan.batch % EXPIRE_EVERY == EXPIRE_EVERY - 1:
                began = time.perf_counter()
                state.expire(root, store, plan.open_from_ms)
                result.expiries_ms.append((time.perf_counter() - began) * 1000)
                result.store_samples.append(listed(root, store))
            if plan.batch % 300 == 299:
                print(
                    f"bench state: ours ({label}) at batch {plan.batch + 1:,} of "
                    f"{len(warm):,}, {time.monotonic() - started:.0f} s",
                    flush=True,
                )
        result.requests = probe.requests.since(Requests())
        # The cold start: no worker holds the state, the driver knows no previous batch.
        result.cold_listed = listed(root, store)
        result.store_samples.append(result.cold_listed)
        state.forget()
        previous.clear()
        before = probe.requests.since(Requests())
        events = _events(last)
        result.cold = [
            _call(
                probe, last, partition, events, root, store, query, previous, snapshot_every, result
            )
            for partition in range(partitions)
        ]
        result.cold_requests = probe.requests.since(before)
    state.forget()
    return result


def _events(plan: BatchPlan) -> pa.Table:
    return attribution_events(pq.read_table(plan.path))


def _call(  # noqa: PLR0913, PLR0917
    probe: Instrumented,
    plan: BatchPlan,
    partition: int,
    events: pa.Table,
    root: str,
    store: ObjectStoreSettings,
    query: str,
    previous: dict[int, int],
    snapshot_every: int,
    result: OursRun,
) -> Call:
    rows = events.filter(pc.equal(events["kafka_partition"], partition))
    probe.phases = Phases()
    before = probe.requests.since(Requests())
    began = time.perf_counter()
    done = state.attribute(
        root,
        store,
        query,
        partition,
        plan.batch,
        rows,
        plan.open_from_ms,
        previous.get(partition),
        ATTRIBUTION,
        snapshot_every=snapshot_every,
    )
    total = (time.perf_counter() - began) * 1000
    spent = probe.requests.since(before)
    if done.saved:
        previous[partition] = plan.batch
    add_totals(result.totals.setdefault(plan.batch, {}), done.increments)
    return Call(
        batch=plan.batch,
        partition=partition,
        total_ms=total,
        read_ms=probe.phases.read,
        write_ms=probe.phases.write,
        snapshot_ms=probe.phases.snapshot,
        objects_read=spent.reads,
        bytes_read=spent.bytes_read,
        objects_written=spent.writes,
        snapshotted=done.snapshotted,
    )


def add_totals(totals: BucketTotals, increments: pa.Table) -> None:
    """Add ``increments`` (speed_layer.attribution.INCREMENTS_SCHEMA) to per-bucket totals."""
    if increments.num_rows == 0:
        return
    starts = increments["bucket_start"].cast(pa.int64()).to_pylist()  # microseconds
    columns = [increments[m].to_pylist() for m in MEASURES]
    for row, start in enumerate(starts):
        into = totals.setdefault(start // 1000, [0, 0, 0])
        for index, column in enumerate(columns):
            into[index] += int(column[row])


def listed(root: str, store: ObjectStoreSettings) -> tuple[int, int]:
    """The objects under ``root`` and their bytes."""
    filesystem, base = arrow_filesystem(root, store)
    selector = pafs.FileSelector(base.rstrip("/"), allow_not_found=True, recursive=True)
    infos = [i for i in filesystem.get_file_info(selector) if i.type == pafs.FileType.File]
    return len(infos), sum(i.size or 0 for i in infos)
