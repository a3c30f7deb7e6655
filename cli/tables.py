"""The tables ``ctr`` prints: readable in an 80-column terminal, and the same rows for scripts.

A command that prints a table builds a :class:`Listing` and shows it with :func:`print_table`,
its ``--wide`` and ``--json`` options the same everywhere (:data:`Wide`, :data:`Json`).

At the terminal's width a table keeps what tells its rows apart: each value of a ``whole``
column (an id, a name, a scope) stays on one line, never wrapped or cut to "…"; the other
columns wrap between words, a word folded only when nothing else fits (a long URL). Rich alone
would cut every column alike once the words do not fit (``ad-001…``). ``--wide``: the table at
the width it needs. ``--json``: one JSON document instead, every value in full under stable keys.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.console import SafeConsole, printable

Wide = Annotated[
    bool,
    typer.Option(
        "--wide", help="The table at the width it needs, whatever the terminal's: a row a line."
    ),
]
Json = Annotated[
    bool,
    typer.Option(
        "--json",
        help="One JSON document on stdout instead of the table: every value in full under "
        "stable keys, times ISO-8601 with their offset.",
    ),
]
# --wide's width: no terminal is this wide, no table needs more.
_UNLIMITED: Final = 100_000
# The fewest cells a folded column keeps while another can fold instead.
_FOLDED: Final = 8

Cell = str | Text


@dataclass(frozen=True)
class Column:
    """A column of a :class:`Listing`: ``whole``, its values are never wrapped or cut (those
    that tell rows apart: ids, names, short words like a scope or a status)."""

    header: str
    whole: bool = False
    justify: Literal["left", "right"] = "left"


@dataclass(frozen=True)
class _Measure:
    natural: int  # its longest line, the header's included
    header_word: int  # the header's longest word
    value: int  # its values' longest line
    word: int  # its values' longest word


class Listing:
    """A table's columns, rows and caption, laid out for a width when printed."""

    def __init__(self, *columns: Column | str, caption: str | None = None) -> None:
        self.columns = tuple(c if isinstance(c, Column) else Column(c) for c in columns)
        self.caption = caption
        self.rows: list[tuple[Cell, ...]] = []

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(self.columns)} cells a row, got {len(cells)}")
        self.rows.append(cells)

    def table(self, width: int | None = None) -> Table:
        """The Rich table, its columns' widths chosen to fit ``width`` terminal columns (None:
        as wide as its rows)."""
        table = Table(*(c.header for c in self.columns), caption=self.caption)
        measures = self._measures()
        widths = None
        if width is not None:
            if sum(_least(measures, self.columns, headers=True)) > width - _chrome(table):
                table.show_edge = False  # two more columns for the cells
            widths = _fit(measures, self.columns, width - _chrome(table))
        for index, (column, spec) in enumerate(zip(table.columns, self.columns, strict=True)):
            column.justify = spec.justify
            column.overflow = "fold"  # a word wider than its column folds, never "…"
            column.no_wrap = spec.whole
            if widths is not None:  # wide enough for whole values, unless nothing was
                column.width = widths[index]
                column.no_wrap = False
        for row in self.rows:
            table.add_row(*row)
        return table

    def _measures(self) -> list[_Measure]:
        found = []
        for index, spec in enumerate(self.columns):
            values = [line for row in self.rows for line in _shown(row[index]).splitlines()]
            header = spec.header.splitlines()
            found.append(
                _Measure(
                    natural=_longest(header + values),
                    header_word=_longest(w for line in header for w in line.split()),
                    value=_longest(values),
                    word=_longest(w for line in values for w in line.split()),
                )
            )
        return found


def print_table(listing: Listing, out: Console, *, wide: bool = False) -> None:
    """``listing`` on ``out``, fitted to its width; ``wide``: at the width it needs."""
    if wide:
        SafeConsole(file=out.file, width=_UNLIMITED).print(listing.table())
    else:
        out.print(listing.table(out.width))


def print_json(document: Mapping[str, object]) -> None:
    """``document`` on stdout as one JSON document (times ISO-8601; every character outside
    ASCII escaped, so no value can steer the terminal)."""
    typer.echo(json.dumps(document, indent=2, default=_json_value))


def one_output(as_json: bool, wide: bool) -> None:
    """A usage error for ``--json`` with ``--wide`` (a table's width means nothing in JSON)."""
    if as_json and wide:
        raise typer.BadParameter("--json or --wide, not both", param_hint="--wide")


def minute(moment: dt.datetime) -> str:
    """A time as the tables show it: to the minute, its zone said once, in the caption."""
    return f"{moment:%Y-%m-%d %H:%M}"


def _json_value(value: object) -> object:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _shown(cell: Cell) -> str:
    """What a cell shows: a plain string as the console prints it (controls escaped)."""
    return cell.plain if isinstance(cell, Text) else printable(cell)


def _longest(texts: Iterable[str]) -> int:
    return max((cell_len(text) for text in texts), default=1) or 1


def _chrome(table: Table) -> int:
    """The terminal columns a table's box and padding take besides its cells' text."""
    columns = len(table.columns)
    _, right, _, left = table.padding
    rules = ((2 if table.show_edge else 0) + columns - 1) if table.box else 0
    return rules + columns * (left + right)


def _least(measures: Sequence[_Measure], columns: Sequence[Column], *, headers: bool) -> list[int]:
    """The narrowest each column can be without folding a word: a whole column its longest
    value and its header's words, another its longest word; ``headers``: its header's too."""
    return [
        max(m.value if c.whole else m.word, m.header_word if headers or c.whole else 1)
        for m, c in zip(measures, columns, strict=True)
    ]


def _fit(measures: Sequence[_Measure], columns: Sequence[Column], room: int) -> list[int] | None:
    """Each column's width for ``room`` cells of text (None: every row fits on its lines).

    A whole column gets its longest value, another its longest word, its header's words
    too where they fit (a whole column's always). When not even the values' words fit, the
    column of the longest folds first (a URL before a rule's words); when not even whole
    values fit, every column folds. The room left goes first to the columns it lets show a
    row a line (the nearest first), then evenly."""
    natural = [m.natural for m in measures]
    if sum(natural) <= room:
        return None
    every = list(range(len(columns)))
    unfolded = _least(measures, columns, headers=True)
    if sum(unfolded) <= room:
        return _grow(unfolded, natural, room, every)
    least = _least(measures, columns, headers=False)
    # The columns of the longest words fold first, each down to a few cells if need be, then
    # all of them further, the widest first.
    folding = sorted((i for i, c in enumerate(columns) if not c.whole), key=lambda i: -least[i])
    for index in folding:
        least[index] -= max(min(sum(least) - room, least[index] - _FOLDED), 0)
    while sum(least) > room and folding:
        widest = max(folding, key=lambda i: least[i])
        if least[widest] <= 1:
            break
        least[widest] -= 1
    if sum(least) > room:
        least = [1] * len(columns)
    # The headers' words first, then the rows' lines.
    headed = [max(w, u) for w, u in zip(least, unfolded, strict=True)]
    return _grow(_grow(least, headed, room, every), natural, room, every)


def _grow(widths: list[int], target: list[int], room: int, growing: list[int]) -> list[int]:
    """``widths`` grown toward ``target`` until they fill ``room``: first the columns that
    reach it, the nearest first, then the narrowest a cell at a time."""
    widths = list(widths)
    extra = room - sum(widths)
    for index in sorted(growing, key=lambda i: target[i] - widths[i]):
        need = target[index] - widths[index]
        if need > extra:
            break
        widths[index] += need
        extra -= need
    while extra > 0:
        short = [i for i in growing if widths[i] < target[i]]
        if not short:
            break
        widths[min(short, key=lambda i: widths[i])] += 1
        extra -= 1
    return widths
