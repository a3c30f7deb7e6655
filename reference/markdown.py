"""Small Markdown writers the reference pages share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

GENERATED = (
    '!!! note "Generated"\n'
    "    This page is generated from the code ({source}) by `make reference`; edit the code "
    "and run it, not the page. `make docs` fails while the page and the code disagree.\n"
)


def cell(text: object) -> str:
    """``text`` fit for one table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """``text`` as inline code (backticks inside doubled around)."""
    value = str(text)
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; every cell through :func:`cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def page(title: str, source: str, intro: str, body: Iterable[str]) -> str:
    """A whole page: its title, the generated notice naming ``source``, ``intro``, ``body``."""
    return "\n".join([f"# {title}", "", GENERATED.format(source=source), intro, "", *body]) + "\n"
