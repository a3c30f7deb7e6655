"""Reach sketches: distinct users as Apache DataSketches HLL sketches that merge across minutes,
dimensions and the batch/speed boundary.

The format is the one Spark's ``hll_sketch_agg(user_id, 12)`` writes (HLL_8, the updatable
serialization, Spark's default ``lgConfigK`` of 12, the same hash): Spark's sketches read here
with Spark's estimate, and Spark reads these (``tests/test_sketches.py``), so either side may
write one and the serving layer unions what both wrote. A full sketch is 4,136 bytes
(40 + 2^12); one of a few users a few dozen. Once unioned, its relative standard error is
1.62 % (:data:`RELATIVE_ERROR`): the bounds of :func:`union` are two standard errors (about
95 %). Null and empty ids are not users (as in Spark's aggregate).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import datasketches as ds
import pyarrow as pa

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
    """The sketch of ``user_ids``, in Spark's format."""
    hll = ds.hll_sketch(LG_K, ds.tgt_hll_type.HLL_8)
    for user in user_ids:
        if user:
            hll.update(user)
    return bytes(hll.serialize_updatable())


def union(sketches: Iterable[bytes | None]) -> Estimate:
    """The distinct users of the union of ``sketches`` (nulls skipped; none: 0 users): the
    estimate of the unioned sketch (:func:`union_sketch`), so the SQL sandbox's
    ``sketch_estimate(sketch_union(…))`` of the same rows says the same."""
    return estimate(_union(sketches))


def estimate(sketch: ds.hll_sketch) -> Estimate:
    return Estimate(
        sketch.get_estimate(), sketch.get_lower_bound(STD_DEVS), sketch.get_upper_bound(STD_DEVS)
    )


def _union(sketches: Iterable[bytes | None]) -> ds.hll_sketch:
    merged = ds.hll_union(LG_K)
    for data in sketches:
        if data is not None:
            merged.update(ds.hll_sketch.deserialize(data))
    return merged.get_result(ds.tgt_hll_type.HLL_8)


def union_sketch(sketches: Iterable[bytes | None]) -> bytes:
    """The union of ``sketches`` as one sketch in Spark's format (for rolled-up rows)."""
    return bytes(_union(sketches).serialize_updatable())


def register(con: duckdb.DuckDBPyConnection) -> None:
    """Give ``con`` (DuckDB) the SQL functions of sketches: ``sketch_union(BLOB[]) -> BLOB``
    (:func:`union_sketch`; ``list(reach_sketch)`` of any rows) and ``sketch_estimate(BLOB)
    -> DOUBLE`` (distinct users of a sketch; null: null). DuckDB has no HLL sketch of its own
    that reads these."""
    import duckdb
    from duckdb.func import ARROW

    blob = duckdb.sqltype("BLOB")

    def unions(lists: pa.Array) -> pa.Array:
        return pa.array(
            [None if s is None else union_sketch(s) for s in lists.to_pylist()], pa.binary()
        )

    def estimates(blobs: pa.Array) -> pa.Array:
        return pa.array(
            [
                None if s is None else ds.hll_sketch.deserialize(s).get_estimate()
                for s in blobs.to_pylist()
            ],
            pa.float64(),
        )

    con.create_function("sketch_union", unions, [duckdb.list_type(blob)], blob, type=ARROW)
    con.create_function("sketch_estimate", estimates, [blob], duckdb.sqltype("DOUBLE"), type=ARROW)
