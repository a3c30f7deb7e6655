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
