"""Exact sets of users as Roaring bitmaps of their numbers in the user dictionary
(``batch/users``: one dense number per user id, :mod:`batch_layer.users`).

A batch hour row holds the users it reached as a bitmap (:data:`views.columns.USER_BITMAPS`, the
portable Roaring format, the one Java's and C's Roaring libraries read). The distinct users of
any set of hour rows are the size of the union of their bitmaps: exact, whatever the rows'
grouping, in native code (pyroaring, CRoaring). Measured on a day of 17.8M impressions from
1M users (``python -m bench reach``): the union of 22 hours' 6,600 hour bitmaps takes 39 ms,
the distinct count of the same users' ids 1.8 s.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

EMPTY: Final = bytes(BitMap().serialize())


def bitmap(numbers: Iterable[int]) -> bytes:
    """The serialized bitmap of ``numbers`` (user numbers: 0 to 2^32 - 1)."""
    return bytes(BitMap(numbers).serialize())


def union_size(bitmaps: Iterable[bytes | None]) -> int:
    """The distinct users of the union of serialized ``bitmaps`` (nulls skipped)."""
    return len(BitMap.union(BitMap(), *(BitMap.deserialize(b) for b in bitmaps if b is not None)))


def bitmap_batches(
    batches: Iterator[pa.RecordBatch], columns: tuple[str, ...]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: ``batches`` with each of ``columns`` (lists of user numbers, null
    values and null lists skipped) as a serialized bitmap, the other columns as they are."""
    for batch in batches:
        arrays = []
        for name in batch.schema.names:
            column = batch.column(name)
            if name in columns:
                column = pa.array(_bitmaps(column), pa.binary())
            arrays.append(column)
        yield pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _bitmaps(lists: pa.ListArray) -> list[bytes]:
    """A serialized bitmap per list of ``lists`` (a null list: empty)."""
    values = lists.values
    if values.null_count:  # rare: nulls among the numbers, skipped one by one
        return [bitmap(n for n in (v or ()) if n is not None) for v in lists.to_pylist()]
    numbers = values.to_numpy().astype("uint32", copy=False)
    offsets = lists.offsets.to_numpy()
    return [
        bytes(BitMap(_uint32s(numbers[offsets[i] : offsets[i + 1]])).serialize())
        for i in range(len(lists))
    ]


def union_sorted(
    batches: Iterator[pa.RecordBatch], keys: tuple[str, ...], columns: tuple[str, ...]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over rows sorted by ``keys`` (each key's rows in one partition,
    together): per key one row, its ``keys`` and each of ``columns`` (lists of user numbers)
    as the serialized bitmap of every list's numbers (nulls skipped).

    Streams: one bitmap per column is held while a key's rows pass, whatever their number, and
    each batch costs a Python call per key it holds, never per row (a key's numbers are added
    to its bitmap from one slice of the batch's values)."""
    current: tuple[object, ...] | None = None
    held = [BitMap() for _ in columns]
    schema = pa.schema([])
    done: list[tuple[tuple[object, ...], list[bytes]]] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        starts = key_starts(batch, keys)
        # The keys' values at their first rows only.
        first_rows = pa.array(starts)
        key_values = [batch.column(k).take(first_rows).to_pylist() for k in keys]
        numbers = [_numbers(batch.column(c)) for c in columns]
        bounds = [*starts.tolist(), batch.num_rows]
        for n, (begin, end) in enumerate(itertools.pairwise(bounds)):
            key = tuple(values[n] for values in key_values)
            if key != current:
                if current is not None:
                    done.append((current, [bytes(b.serialize()) for b in held]))
                current, held = key, [BitMap() for _ in columns]
            for bitmap_of, (values, offsets) in zip(held, numbers, strict=True):
                bitmap_of.update(_uint32s(values[offsets[begin] : offsets[end]]))
        schema = batch.schema
        if done:
            yield _keyed_batch(done, schema, keys, columns)
            done = []
    if current is not None:
        yield _keyed_batch([(current, [bytes(b.serialize()) for b in held])], schema, keys, columns)


def _uint32s(numbers: np.ndarray) -> array.array[int]:
    """``numbers`` (uint32) as an ``array.array``: pyroaring copies those at once, where it
    takes a NumPy array's numbers one by one (6x slower on 2 M numbers)."""
    copied = array.array("I")
    copied.frombytes(numbers.tobytes())
    return copied


def key_starts(batch: pa.RecordBatch | pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Where a new key starts in ``batch`` (rows sorted by ``keys``; its first row always)."""
    changed = np.zeros(batch.num_rows, dtype=bool)
    changed[0] = True
    for name in keys:
        column = batch.column(name)
        differs = pc.not_equal(column.slice(1), column.slice(0, batch.num_rows - 1))
        nulls = pc.xor(column.slice(1).is_null(), column.slice(0, batch.num_rows - 1).is_null())
        changed[1:] |= pc.or_kleene(differs, nulls).fill_null(False).to_numpy(zero_copy_only=False)
    return np.flatnonzero(changed)


def group_bitmaps(lists: pa.Array | pa.ChunkedArray, starts: np.ndarray) -> pa.BinaryArray:
    """Per group of consecutive rows of ``lists`` (lists of user numbers; a group from each of
    ``starts`` to the next, the last to the end), the serialized bitmap of every number of its
    rows (null values and null lists skipped): one Python call per group, never per row."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    values, offsets = _numbers(lists)
    bounds = offsets[[*starts.tolist(), len(lists)]]
    return pa.array(
        [
            bytes(BitMap(_uint32s(values[begin:end])).serialize())
            for begin, end in itertools.pairwise(bounds.tolist())
        ],
        pa.binary(),
    )


def _numbers(lists: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The values of a list column (null values dropped, as zeros would count a user) as
    uint32, and its offsets into them."""
    if pa.types.is_large_list(lists.type):
        lists = lists.cast(pa.list_(lists.type.value_type))
    if lists.null_count:
        lists = pc.fill_null(lists, pa.scalar([], lists.type))
    values = lists.values
    offsets = lists.offsets.to_numpy()
    if values.null_count:  # rare: drop them, moving the offsets with them
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        kept = np.concatenate([[0], np.cumsum(valid)])
        return values.drop_null().to_numpy().astype("uint32"), kept[offsets]
    return values.to_numpy(zero_copy_only=False).astype("uint32", copy=False), offsets


def _keyed_batch(
    rows: list[tuple[tuple[object, ...], list[bytes]]],
    schema: pa.Schema,
    keys: tuple[str, ...],
    columns: tuple[str, ...],
) -> pa.RecordBatch:
    arrays = [
        pa.array([key[i] for key, _ in rows], schema.field(name).type)
        for i, name in enumerate(keys)
    ]
    arrays += [pa.array([b[j] for _, b in rows], pa.binary()) for j in range(len(columns))]
    return pa.RecordBatch.from_arrays(arrays, names=[*keys, *columns])
