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

from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa
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
        bytes(BitMap(numbers[offsets[i] : offsets[i + 1]]).serialize()) for i in range(len(lists))
    ]
