"""Reach sketches: distinct users as Apache DataSketches HLL sketches that merge across minutes,
dimensions and the batch/speed boundary.

The format is Apache DataSketches' HLL with Spark's ``lgConfigK`` of 12 and hash, as
``hll_sketch_agg(user_id, 12)`` makes it, stored compact as HLL_4 (Spark's own is HLL_8,
updatable): Spark's sketches read here with Spark's estimate, and Spark reads these
(``tests/integration/test_sketches.py``), so either side may write one and the serving layer
unions what both wrote. A full sketch is 2,088 bytes (Spark's updatable HLL_8: 4,136); one of
a user 12 bytes (40), of five users 28 (40): a row holds one or two users at real cardinality,
so the compact form is about a third of the updatable one's bytes for the same registers and
the same estimates. Once unioned, its relative standard error is 1.62 %
(:data:`RELATIVE_ERROR`): the bounds of :func:`union` are two standard errors (about 95 %).
Null and empty ids are not users (as in Spark's aggregate).

**One answer per set of users.** A sketch past its small modes estimates with its HIP
accumulator, which follows the order its users came in: the union of a day's minute sketches
and the union of the same day's hour sketches (themselves unions) would say different numbers
for the same users, and so would two orders of the same minutes. :func:`estimate` always reads
such a sketch by its registers (DataSketches' composite estimator, the one a union of large
sketches uses anyway): the registers are the maximum over the users' hashes, the same whatever
the order or grouping of the unions. A sketch in its small modes holds its users' coupons, a set:
the same too.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import datasketches as ds
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from views.errors import ViewError

if TYPE_CHECKING:
    import duckdb

LG_K: Final = 12
STD_DEVS: Final = 2
# One standard error of a unioned sketch's estimate, relative (DataSketches' measured table).
RELATIVE_ERROR: Final = abs(ds.hll_sketch.get_rel_err(True, True, LG_K, 1))


@dataclass(frozen=True)
class Estimate:
    """Distinct users: the estimate and its bounds (:data:`STD_DEVS` standard errors)."""

    value: float
    low: float
    high: float


def sketch(user_ids: Iterable[str | None]) -> bytes:
    """The sketch of ``user_ids`` (compact HLL_4: see the module's docstring)."""
    hll = ds.hll_sketch(LG_K, ds.tgt_hll_type.HLL_4)
    for user in user_ids:
        if user:
            hll.update(user)
    return bytes(hll.serialize_compact())


def union(sketches: Iterable[bytes | None]) -> Estimate:
    """The distinct users of the union of ``sketches`` (nulls skipped; none: 0 users): the
    estimate of the unioned sketch (:func:`union_sketch`), so the SQL sandbox's
    ``sketch_estimate(sketch_union(…))`` of the same rows says the same."""
    return estimate(_union(sketches))


def estimate(sketch: ds.hll_sketch) -> Estimate:
    """The distinct users of ``sketch`` and their bounds, by its registers (see the module's
    docstring): the same for every sketch of the same users."""
    settled = _by_registers(sketch)
    return Estimate(
        settled.get_estimate(),
        settled.get_lower_bound(STD_DEVS),
        settled.get_upper_bound(STD_DEVS),
    )


# The serialized sketch's preamble (DataSketches' HLL format): the flags byte, its
# out-of-order flag, the mode byte and, in its low bits, the mode of a sketch past its small
# ones.
_FLAGS_BYTE: Final = 5
_OUT_OF_ORDER: Final = 16
_MODE_BYTE: Final = 7
_HLL_MODE: Final = 2


def _by_registers(sketch: ds.hll_sketch) -> ds.hll_sketch:
    """``sketch`` marked out of order when it is past its small modes: DataSketches then
    estimates from its registers (the composite estimator), as it does for a union of large
    sketches, instead of from the HIP accumulator its order of updates built."""
    data = bytearray(sketch.serialize_updatable())
    if data[_MODE_BYTE] & 3 != _HLL_MODE or data[_FLAGS_BYTE] & _OUT_OF_ORDER:
        return sketch
    data[_FLAGS_BYTE] |= _OUT_OF_ORDER
    return ds.hll_sketch.deserialize(bytes(data))


def sketch_estimate(data: bytes) -> float:
    """The distinct users of the serialized sketch ``data`` (:func:`estimate`'s value)."""
    return float(estimate(ds.hll_sketch.deserialize(data)).value)


def _union(sketches: Iterable[bytes | None]) -> ds.hll_sketch:
    """The union of ``sketches``, the same whatever their order: an HLL union's estimator
    state depends on the order it was given its sketches (the SQL sandbox's ``list()`` of a
    parallel aggregate has none), so they are unioned in the order of their bytes (the same
    bytes; :func:`estimate` reads the same number whatever the order)."""
    merged = ds.hll_union(LG_K)
    for data in sorted(s for s in sketches if s is not None):
        merged.update(ds.hll_sketch.deserialize(data))
    return merged.get_result(ds.tgt_hll_type.HLL_4)


def union_sketch(sketches: Iterable[bytes | None]) -> bytes:
    """The union of ``sketches`` as one sketch (compact HLL_4, as :func:`sketch`'s: for
    rolled-up rows)."""
    return bytes(_union(sketches).serialize_compact())


def group_unions(sketches: pa.Array | pa.ChunkedArray, starts: np.ndarray) -> pa.BinaryArray:
    """Per group of consecutive rows of ``sketches`` (a group from each of ``starts`` to the
    next, the last to the end), the union of its sketches (:func:`union_sketch`; all null:
    null). A group of one sketch (and nulls) keeps that sketch's bytes: no sketch is read for
    it, and at real cardinality most groups are such."""
    if isinstance(sketches, pa.ChunkedArray):
        sketches = sketches.combine_chunks()
    if not len(sketches):
        return pa.array([], pa.binary())
    valid = sketches.is_valid().to_numpy(zero_copy_only=False)
    counts = np.add.reduceat(valid.astype(np.int64), starts)
    last = np.maximum.reduceat(np.where(valid, np.arange(len(sketches)), -1), starts)
    unioned = sketches.take(pa.array(last, pa.int64(), mask=last < 0))
    several = counts > 1
    if not several.any():
        return unioned
    bounds = np.append(starts, len(sketches))
    values = sketches.to_pylist()
    merged = [
        union_sketch(values[begin:end])
        for begin, end in zip(
            bounds[:-1][several].tolist(), bounds[1:][several].tolist(), strict=True
        )
    ]
    return pc.replace_with_mask(unioned, pa.array(several), pa.array(merged, pa.binary()))


class SealError(ViewError, ValueError):
    """A value given as a sealed sketch that is not one of this database's."""


class SketchSeal:
    """Sketches for readers who may not see users (analyst and advertiser keys).

    A sketch in its small modes (LIST, SET: up to a few hundred users, most rows) holds each
    user's 32-bit hash coupon as is, so whoever reads the bytes can match them against the
    hashes of guessed ids, and the coupons follow a user across rows and campaigns. A sealed
    sketch is the sketch encrypted and authenticated (AES-GCM, a fresh nonce per value) with a
    key that lives in one database only (the SQL sandbox opens one per query): its bytes say
    nothing but their length, no two reads of a sketch are alike, and a sketch made by the
    reader (from guessed ids, say) is refused instead of being unioned with the real ones.
    :func:`register` then gives the database the sealed forms of the sketch functions:
    ``sketch_union`` unions sealed sketches into a sealed one, ``sketch_estimate`` returns only
    a number."""

    MAGIC: Final = b"ctr-sealed-sketch:"

    def __init__(self) -> None:
        self._aead = AESGCM(AESGCM.generate_key(bit_length=128))
        # 96-bit nonces: 4 random bytes and a counter, never repeated within a key's life.
        self._prefix = os.urandom(4)
        self._counter = itertools.count()
        # The SQL name the database's views call to seal their rows' sketches: not on the SQL
        # sandbox's allow-list, and unguessable besides (one per database).
        self.function = f"seal_{secrets.token_hex(8)}"

    def seal(self, sketch: bytes) -> bytes:
        nonce = self._prefix + next(self._counter).to_bytes(8, "big")
        return self.MAGIC + nonce + self._aead.encrypt(nonce, sketch, None)

    def open(self, sealed: bytes) -> bytes:
        """The sketch ``sealed`` holds; :class:`SealError` unless this seal sealed it."""
        start = len(self.MAGIC)
        if not sealed.startswith(self.MAGIC) or len(sealed) < start + 12 + 16:
            raise SealError(_NOT_SEALED)
        try:
            return self._aead.decrypt(sealed[start : start + 12], sealed[start + 12 :], None)
        except InvalidTag:
            raise SealError(_NOT_SEALED) from None


_NOT_SEALED: Final = (
    "not a sketch of this query's views: with an analyst or advertiser key the sketch columns "
    "are sealed (they hold no user hashes), and only the views' own sketches can be unioned "
    "(sketch_union) and estimated (sketch_estimate)"
)


def register(con: duckdb.DuckDBPyConnection, seal: SketchSeal | None = None) -> None:
    """Give ``con`` (DuckDB) the SQL functions of sketches: ``sketch_union(BLOB[]) -> BLOB``
    (:func:`union_sketch`; ``list(reach_sketch)`` of any rows) and ``sketch_estimate(BLOB)
    -> DOUBLE`` (distinct users of a sketch; null: null). DuckDB has no HLL sketch of its own
    that reads these.

    With ``seal``, both take sealed sketches only (:class:`SketchSeal`; ``sketch_union``
    returns one), and ``seal.function(BLOB) -> BLOB`` seals a sketch (for the views)."""
    import duckdb
    from duckdb.func import ARROW

    blob = duckdb.sqltype("BLOB")
    opened = (lambda s: s) if seal is None else seal.open
    sealed = (lambda s: s) if seal is None else seal.seal

    def unions(lists: pa.Array) -> pa.Array:
        return pa.array(
            [
                None if s is None else sealed(union_sketch(opened(x) for x in s if x is not None))
                for s in lists.to_pylist()
            ],
            pa.binary(),
        )

    def estimates(blobs: pa.Array) -> pa.Array:
        return pa.array(
            [None if s is None else sketch_estimate(opened(s)) for s in blobs.to_pylist()],
            pa.float64(),
        )

    con.create_function("sketch_union", unions, [duckdb.list_type(blob)], blob, type=ARROW)
    con.create_function("sketch_estimate", estimates, [blob], duckdb.sqltype("DOUBLE"), type=ARROW)
    if seal is not None:

        def seals(blobs: pa.Array) -> pa.Array:
            return pa.array(
                [None if s is None else seal.seal(s) for s in blobs.to_pylist()], pa.binary()
            )

        con.create_function(seal.function, seals, [blob], blob, type=ARROW)
