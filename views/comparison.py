"""Two answers of a view side by side, per minute bucket and dimensions: what changes when
readers move from side ``a`` to side ``b``.

One value for both ways the platform compares answers before it replaces anything: two
versions of a view as readers would see them (:func:`serving_layer.diff.diff_versions`, `ctr
views diff`, the ``ctr_reprocess`` review) and a recompute against the rows a batch table holds
now (:func:`batch_layer.preview.preview`, `ctr backfill --preview`, ``ctr_batch``'s preview).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# A count of both sides, None on a side that does not count it (orphan and repeat clicks exist
# only with click attribution; a recompute's preview compares impressions and clicks only).
Pair = tuple[int | None, int | None]
COUNTS: Final = ("impressions", "clicks", "raw_clicks", "orphan_clicks", "repeat_clicks")


@dataclass(frozen=True)
class Change:
    """One bucket and dimensions whose counts differ."""

    bucket_start: dt.datetime
    dimensions: dict[str, str]
    impressions: tuple[int, int]  # (a, b)
    clicks: tuple[int, int]
    raw_clicks: Pair = (None, None)
    orphan_clicks: Pair = (None, None)
    repeat_clicks: Pair = (None, None)

    @property
    def size(self) -> int:
        """How much it changes: the absolute differences of its counts, summed."""
        return sum(abs(b - a) for a, b in _known(self) if a is not None and b is not None)


@dataclass(frozen=True)
class Comparison:
    """Side ``a`` against side ``b`` (``a``/``b``: what each side is, e.g. ``v1``/``v3`` or
    ``now``/``after the recompute``) over [start, end): rows (bucket x dimensions) compared
    and changed, rows on one side only, the totals of each count, the largest changes."""

    view: str
    a: str
    b: str
    start: dt.datetime
    end: dt.datetime
    rows_compared: int
    rows_changed: int
    only_in_a: int
    only_in_b: int
    impressions: tuple[int, int]
    clicks: tuple[int, int]
    largest: tuple[Change, ...]
    raw_clicks: Pair = (None, None)
    orphan_clicks: Pair = (None, None)
    repeat_clicks: Pair = (None, None)

    @property
    def changed_fraction(self) -> float:
        return self.rows_changed / self.rows_compared if self.rows_compared else 0.0

    def summary(self) -> dict[str, object]:
        """JSON-ready values (`ctr views diff --json`, the DAG's review log)."""
        return {
            "view": self.view,
            "a": self.a,
            "b": self.b,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "rows_compared": self.rows_compared,
            "rows_changed": self.rows_changed,
            "changed_fraction": round(self.changed_fraction, 6),
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            **_pairs(self),
            "largest": [
                {"bucket_start": c.bucket_start.isoformat(), **c.dimensions, **_pairs(c)}
                for c in self.largest
            ],
        }


def combined(parts: Sequence[Comparison], *, largest: int) -> Comparison:
    """Comparisons of consecutive ranges (a backfill's hours) as one, with the ``largest``
    changes of all of them."""
    if not parts:
        raise ValueError("nothing to combine")
    first = parts[0]

    def total(name: str) -> Pair:
        a = [getattr(p, name)[0] for p in parts]
        b = [getattr(p, name)[1] for p in parts]
        return (
            None if None in a else sum(v for v in a if v is not None),
            None if None in b else sum(v for v in b if v is not None),
        )

    changes = sorted((c for p in parts for c in p.largest), key=lambda c: -c.size)
    return Comparison(
        view=first.view,
        a=first.a,
        b=first.b,
        start=min(p.start for p in parts),
        end=max(p.end for p in parts),
        rows_compared=sum(p.rows_compared for p in parts),
        rows_changed=sum(p.rows_changed for p in parts),
        only_in_a=sum(p.only_in_a for p in parts),
        only_in_b=sum(p.only_in_b for p in parts),
        impressions=_ints(total("impressions")),
        clicks=_ints(total("clicks")),
        largest=tuple(changes[:largest]),
        raw_clicks=total("raw_clicks"),
        orphan_clicks=total("orphan_clicks"),
        repeat_clicks=total("repeat_clicks"),
    )


def _known(of: Change | Comparison) -> list[Pair]:
    return [getattr(of, name) for name in COUNTS]


def _pairs(of: Change | Comparison) -> dict[str, dict[str, int | None]]:
    """Each count as ``{"a": …, "b": …}`` (null: that side does not count it)."""
    return {
        name: {"a": pair[0], "b": pair[1]} for name, pair in zip(COUNTS, _known(of), strict=True)
    }


def _ints(pair: Pair) -> tuple[int, int]:
    return (pair[0] or 0, pair[1] or 0)
