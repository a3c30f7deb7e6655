"""Printing a :class:`views.comparison.Comparison`: `ctr views diff`, `ctr backfill --preview`
and the spark-submit application's preview (in the ``ctr_batch`` task's log) print the same
way."""

from __future__ import annotations

from rich.console import Console

from cli.tables import Column, Listing, minute, print_table
from views.columns import DIMENSIONS
from views.comparison import Comparison, Pair


def print_comparison(result: Comparison, out: Console, *, wide: bool = False) -> None:
    """The summary (rows changed, each count's totals) and the largest changes as a table
    (``wide``: at the width it needs)."""
    out.print(
        f"{result.view}: {result.a} -> {result.b}, {result.start:%Y-%m-%d %H:%M} – "
        f"{result.end:%Y-%m-%d %H:%M} UTC: {result.rows_changed:,} of {result.rows_compared:,} "
        f"rows (bucket x dimensions) change ({result.changed_fraction:.2%}); "
        f"{result.only_in_a:,} only in {result.a}, {result.only_in_b:,} only in {result.b}",
        highlight=False,
    )
    counts = [
        f"{label} {change(pair)}"
        for label, pair in (
            ("impressions", result.impressions),
            ("clicks", result.clicks),
            ("raw clicks", result.raw_clicks),
            ("orphan clicks", result.orphan_clicks),
            ("repeat clicks", result.repeat_clicks),
        )
        # A count neither side has (a preview's raw clicks, attribution counts of two versions
        # without attribution) is left out; one side without it shows "n/a".
        if pair != (None, None)
    ]
    out.print("; ".join(counts), highlight=False)
    if result.largest:
        print_table(changes_listing(result), out, wide=wide)


def changes_listing(result: Comparison) -> Listing:
    """The largest changes as a table: a row per bucket and dimensions (the dimensions in one
    column, each value a word: whole, however narrow the terminal)."""
    listing = Listing(
        "bucket",
        ", ".join(d.removesuffix("_id").removesuffix("_type") for d in DIMENSIONS),
        Column("impressions", justify="right"),
        Column("clicks", justify="right"),
        Column("raw clicks", justify="right"),
        caption="times in UTC",
    )
    for c in result.largest:
        listing.add_row(
            minute(c.bucket_start),
            ", ".join(str(c.dimensions.get(d) or "-") for d in DIMENSIONS),
            change(c.impressions, delta=False),
            change(c.clicks, delta=False),
            change(c.raw_clicks, delta=False),
        )
    return listing


def change(pair: Pair | tuple[int, int], *, delta: bool = True) -> str:
    """``a -> b (+d)``; a side without the count is ``n/a``."""
    first, second = pair
    text = f"{_count(first)} -> {_count(second)}"
    if delta and first is not None and second is not None:
        text += f" ({second - first:+,})"
    return text


def _count(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"
