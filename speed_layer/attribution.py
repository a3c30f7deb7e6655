"""The speed layer's approximation of click attribution (version 3 of ``ctr``): each click
credited to its impression, in the task that counts its Kafka partition, without a
stream-stream join.

The batch layer attributes exactly: a click counts for its impression when it happened within
the version's window (an hour) after it. A stream-stream join would keep an hour of impressions
in Spark's state and hold impressions back until their clicks could no longer come; the speed
layer must stay fresh within a second. So each partition's state (:mod:`speed_layer.state`: held
by the Python worker that counts the partition, persisted beside the checkpoint) keeps only the
impressions of the buckets that are still *open* (the watermark has not closed them, about the
last ``SPEED_WATERMARK``): a 64-bit hash of each impression id, its event time, its bucket and
dimensions, and whether it was clicked yet. Per micro-batch, impressions are added before the
clicks are looked up; a click (on time, within the window after its impression) whose impression
is

- in that state and not clicked yet: one ``attributed_clicks`` on the impression's key (its
  bucket and dimensions), which is then clicked;
- in that state and clicked already: one ``repeat_clicks`` on the impression's key;
- not in it: one ``orphan_clicks`` on the click's own key.

Only impressions counted on time (in an open bucket, so in ``speed/ctr``'s impressions of the
same micro-batch) enter the state, and each is attributed once: summed per key,
``attributed_clicks <= impressions``. Increments land on open buckets only (an impression's
entry goes when the watermark closes its bucket), so they are never late.

The error, until the batch layer covers the buckets: a click is an orphan where the batch
layer would attribute it (orphans overstated, attributed and repeat clicks understated) when
its impression's bucket closed before the click came (an impression more than about the
watermark before its click), or when the impression arrives after its click. (A restart, on
this host or another, rebuilds the state from its snapshot and change files: nothing is lost
there.) Duplicated events are not removed (as elsewhere in the speed
layer): a duplicated impression is one entry clicked once, a duplicated click a repeat click.
Two impression ids with the same 64-bit hash (about one chance in 10^6 per day at a few
thousand impressions per second) would be taken for one.

Cost: 21 bytes per open impression (hash, time, key index, flag) plus each micro-batch's
distinct dimensions: 3.2 million impressions (5,000 events per second, a 10-minute watermark)
took 190 MB with every impression's dimensions distinct (the worst case), and 12 ms per 1-s
micro-batch at the median, 21 ms at the 95th percentile (measured in-process on this 2-core
machine, random ids and dimensions).
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from views.columns import DIMENSIONS

BUCKET_MS: Final = 60_000  # the view's bucket width
MEASURES: Final = ("attributed_clicks", "orphan_clicks", "repeat_clicks")
KEY: Final = ("bucket_start", *DIMENSIONS)
# The micro-batch's events as process() takes them.
EVENTS_SCHEMA: Final = pa.schema(
    [
        ("impression", pa.int64()),  # 64-bit hash of impression_id
        ("event_type", pa.string()),
        ("event_ms", pa.int64()),  # event time, epoch milliseconds
        *((d, pa.string()) for d in DIMENSIONS),
    ]
)
# The state as a table (a snapshot, speed_layer.state): each open impression with its bucket and
# its chunk within the bucket (oldest first), in the chunk's order; restoring it gives an
# Attribution that attributes every later click as the original would.
SNAPSHOT_SCHEMA: Final = pa.schema(
    [
        ("bucket_ms", pa.int64()),
        ("chunk", pa.int32()),
        ("impression", pa.int64()),
        ("event_ms", pa.int64()),
        ("clicked", pa.bool_()),
        *((d, pa.string()) for d in DIMENSIONS),
    ]
)
INCREMENTS_SCHEMA: Final = pa.schema(
    [
        ("bucket_start", pa.timestamp("us", tz="UTC")),
        *((d, pa.string()) for d in DIMENSIONS),
        *((m, pa.int64()) for m in MEASURES),
    ]
)

Int64s = npt.NDArray[np.int64]


@dataclass
class _Chunk:
    """Impressions of one bucket, sorted by hash (equal hashes in arrival order)."""

    hashes: Int64s
    times: Int64s
    keys: npt.NDArray[np.int32]  # row of ``dims`` per impression
    clicked: npt.NDArray[np.bool_]
    dims: pa.Table  # the distinct dimensions of the chunk's impressions

    @property
    def nbytes(self) -> int:
        arrays = (self.hashes, self.times, self.keys, self.clicked)
        return sum(int(a.nbytes) for a in arrays) + int(self.dims.nbytes)


class Attribution:
    """The open impressions and the attribution of each micro-batch's clicks to them."""

    def __init__(self, window: dt.timedelta) -> None:
        if window <= dt.timedelta(0):
            raise ValueError(f"'window' must be positive, got {window}")
        self.window_ms = int(window.total_seconds() * 1000)
        # Open buckets by start (epoch ms): their impressions, oldest chunk first.
        self._buckets: dict[int, list[_Chunk]] = {}

    @property
    def impressions(self) -> int:
        """Impressions held (of open buckets)."""
        return sum(len(c.hashes) for chunks in self._buckets.values() for c in chunks)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for chunks in self._buckets.values() for c in chunks)

    def process(self, events: pa.Table, open_from_ms: int) -> pa.Table:
        """Add the micro-batch's impressions, then attribute its clicks; returns the
        increments per key (:data:`INCREMENTS_SCHEMA`, one row per key with any).

        Parameters
        ----------
        events
            The micro-batch's events, :data:`EVENTS_SCHEMA` (other columns are ignored).
        open_from_ms
            Start of the first open bucket (epoch ms, ``speed_layer.job.closed_before`` of
            the batch's watermark): events of earlier buckets are late and ignored, and the
            impressions of earlier buckets are forgotten first.
        """
        self.expire(open_from_ms)
        event_ms = _numpy(events["event_ms"])
        on_time = event_ms // BUCKET_MS * BUCKET_MS >= open_from_ms
        impressions = on_time & _is(events, "impression")
        clicks = on_time & _is(events, "click")
        self._add(events.filter(pa.array(impressions)))
        return self._attribute(events.filter(pa.array(clicks)))

    def to_table(self) -> pa.Table:
        """The open impressions as a :data:`SNAPSHOT_SCHEMA` table (:meth:`from_table`)."""
        parts = []
        for start, chunks in sorted(self._buckets.items()):
            for index, chunk in enumerate(chunks):
                n = len(chunk.hashes)
                dims = chunk.dims.take(pa.array(chunk.keys))
                parts.append(
                    pa.table(
                        {
                            "bucket_ms": pa.array(np.full(n, start, np.int64)),
                            "chunk": pa.array(np.full(n, index, np.int32)),
                            "impression": pa.array(chunk.hashes),
                            "event_ms": pa.array(chunk.times),
                            "clicked": pa.array(chunk.clicked),
                            **{d: dims[d] for d in DIMENSIONS},
                        }
                    ).cast(SNAPSHOT_SCHEMA)
                )
        return pa.concat_tables(parts) if parts else SNAPSHOT_SCHEMA.empty_table()

    @classmethod
    def from_table(cls, table: pa.Table, window: dt.timedelta) -> Attribution:
        """The attribution :meth:`to_table` saved (``window``: the attribution window)."""
        restored = cls(window)
        if table.num_rows == 0:
            return restored
        buckets = _numpy(table["bucket_ms"])
        indices = _numpy(table["chunk"])
        # Rows come chunk by chunk, in order: a new chunk starts where (bucket, chunk) changes.
        change = np.flatnonzero((np.diff(buckets) != 0) | (np.diff(indices) != 0)) + 1
        bounds = [0, *change.tolist(), table.num_rows]
        for begin, end in itertools.pairwise(bounds):
            rows = table.slice(begin, end - begin)
            dims, keys = _distinct(rows.select(list(DIMENSIONS)))
            chunk = _Chunk(
                hashes=_numpy(rows["impression"]),
                times=_numpy(rows["event_ms"]),
                keys=keys,
                clicked=np.asarray(rows["clicked"].to_numpy(zero_copy_only=False), np.bool_),
                dims=dims,
            )
            restored._buckets.setdefault(int(buckets[begin]), []).append(chunk)
        return restored

    def expire(self, open_from_ms: int) -> None:
        """Forget the impressions of the buckets before ``open_from_ms`` (closed)."""
        for start in [s for s in self._buckets if s < open_from_ms]:
            del self._buckets[start]

    def _add(self, impressions: pa.Table) -> None:
        buckets = _numpy(impressions["event_ms"]) // BUCKET_MS * BUCKET_MS
        for start in np.unique(buckets).tolist():
            rows = impressions.filter(pa.array(buckets == start))
            dims, keys = _distinct(rows.select(list(DIMENSIONS)))
            hashes = _numpy(rows["impression"])
            order = np.argsort(hashes, kind="stable")
            chunk = _Chunk(
                hashes=hashes[order],
                times=_numpy(rows["event_ms"])[order],
                keys=keys[order],
                clicked=np.zeros(len(order), np.bool_),
                dims=dims,
            )
            chunks = self._buckets.setdefault(int(start), [])
            chunks.append(chunk)
            # Like a binary counter: a chunk at least as large as the one before it merges into
            # it, so a bucket has a few chunks (log2 of its batches) and each impression is
            # merged a few times.
            while len(chunks) > 1 and len(chunks[-2].hashes) <= len(chunks[-1].hashes):
                chunks[-2:] = [_merge(chunks[-2:])]

    def _attribute(self, clicks: pa.Table) -> pa.Table:
        hashes = _numpy(clicks["impression"])
        click_ms = _numpy(clicks["event_ms"])
        pending = np.ones(len(hashes), np.bool_)  # not found yet
        orphan = np.ones(len(hashes), np.bool_)
        parts: list[pa.Table] = []
        for start, chunks in sorted(self._buckets.items()):
            for chunk in chunks:
                todo = np.flatnonzero(pending)
                if len(todo) == 0:
                    break
                pos = np.searchsorted(chunk.hashes, hashes[todo])
                found = pos < len(chunk.hashes)
                found[found] = chunk.hashes[pos[found]] == hashes[todo[found]]
                clicks_of, pos = todo[found], pos[found]
                pending[clicks_of] = False
                # The first impression of that id is the one: a click before it, or later
                # than the window after it, is an orphan (the batch layer's rule).
                after = click_ms[clicks_of] - chunk.times[pos]
                valid = (after >= 0) & (after <= self.window_ms)
                orphan[clicks_of[valid]] = False
                if valid.any():
                    parts.append(_credit(chunk, start, pos[valid]))
        orphans = clicks.filter(pa.array(orphan))
        if orphans.num_rows:
            parts.append(_orphans(orphans))
        if not parts:
            return INCREMENTS_SCHEMA.empty_table()
        return sum_increments(pa.concat_tables(parts))


def sum_increments(rows: pa.Table) -> pa.Table:
    """One row per key of increments, the measures summed."""
    summed = rows.group_by(list(KEY), use_threads=False).aggregate([(m, "sum") for m in MEASURES])
    return summed.rename_columns([*KEY, *MEASURES]).cast(INCREMENTS_SCHEMA)


def _credit(chunk: _Chunk, start: int, positions: Int64s) -> pa.Table:
    """The increments of clicks on the chunk's impressions at ``positions`` (one per click):
    the first click of an impression not clicked yet is attributed, the others repeats."""
    clicked_now, counts = np.unique(positions, return_counts=True)
    first = ~chunk.clicked[clicked_now]
    chunk.clicked[clicked_now] = True
    attributed = first.astype(np.int64)
    keys = chunk.keys[clicked_now]
    return _rows(
        start,
        chunk.dims.take(pa.array(keys)),
        attributed=attributed,
        repeat=counts.astype(np.int64) - attributed,
    )


def _orphans(clicks: pa.Table) -> pa.Table:
    buckets = _numpy(clicks["event_ms"]) // BUCKET_MS * BUCKET_MS
    n = clicks.num_rows
    return pa.table(
        {
            "bucket_start": pa.array(buckets * 1000, pa.timestamp("us", tz="UTC")),
            **{d: clicks[d] for d in DIMENSIONS},
            "attributed_clicks": pa.array(np.zeros(n, np.int64)),
            "orphan_clicks": pa.array(np.ones(n, np.int64)),
            "repeat_clicks": pa.array(np.zeros(n, np.int64)),
        }
    )


def _rows(start: int, dims: pa.Table, *, attributed: Int64s, repeat: Int64s) -> pa.Table:
    n = dims.num_rows
    return pa.table(
        {
            "bucket_start": pa.array(np.full(n, start * 1000), pa.timestamp("us", tz="UTC")),
            **{d: dims[d] for d in DIMENSIONS},
            "attributed_clicks": pa.array(attributed),
            "orphan_clicks": pa.array(np.zeros(n, np.int64)),
            "repeat_clicks": pa.array(repeat),
        }
    )


def _merge(chunks: list[_Chunk]) -> _Chunk:
    """One chunk of ``chunks`` (oldest first); equal hashes keep their arrival order (a stable
    sort of runs already sorted: about linear)."""
    offsets = np.cumsum([0, *(c.dims.num_rows for c in chunks[:-1])]).astype(np.int32)
    keys = np.concatenate([c.keys + offset for c, offset in zip(chunks, offsets, strict=True)])
    hashes = np.concatenate([c.hashes for c in chunks])
    order = np.argsort(hashes, kind="stable")
    return _Chunk(
        hashes=hashes[order],
        times=np.concatenate([c.times for c in chunks])[order],
        keys=keys[order],
        clicked=np.concatenate([c.clicked for c in chunks])[order],
        dims=pa.concat_tables([c.dims for c in chunks]),
    )


def _distinct(dims: pa.Table) -> tuple[pa.Table, npt.NDArray[np.int32]]:
    """(the distinct rows of ``dims``, the index of each row's among them)."""
    if dims.num_rows == 0:
        return dims, np.zeros(0, np.int32)
    columns = [
        pc.fill_null(pc.dictionary_encode(dims[name]).combine_chunks().indices, -1)
        .to_numpy()
        .astype(np.int64)
        + 1  # null: 0
        for name in dims.column_names
    ]
    # One integer per row (mixed radix: each column's codes are below its count of distinct
    # values + 1), so the rows sort as numbers; rows of several columns sorted as rows (np.unique
    # with axis=0) took half of the attribution's time.
    radices = [int(c.max()) + 1 for c in columns]
    if np.prod(np.asarray(radices, dtype=np.float64)) < 2.0**62:
        key = np.zeros(dims.num_rows, np.int64)
        for codes, radix in zip(columns, radices, strict=True):
            key = key * radix + codes
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        rows = np.column_stack(columns)
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return dims.take(pa.array(first)), inverse.reshape(-1).astype(np.int32)


def _is(events: pa.Table, kind: str) -> npt.NDArray[np.bool_]:
    matches = pc.fill_null(pc.equal(events["event_type"], kind), False)
    return np.asarray(matches.to_numpy(), np.bool_)


def _numpy(column: pa.ChunkedArray | pa.Array) -> Int64s:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.asarray(array.to_numpy(zero_copy_only=False), np.int64)
