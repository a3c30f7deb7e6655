"""The generated pages, by their path under docs/: written by ``make reference``
(``python -m reference``), checked against the code by every ``make docs`` and by the unit
tier, so a page that no longer says what the code does fails the build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

from reference import api_page, cli_page, metrics_page, settings_page, sql_page, tables_page

DOCS: Final = Path(__file__).resolve().parent.parent / "docs"
PAGES: Final[dict[str, Callable[[], str]]] = {
    "reference/configuration.md": settings_page.render,
    "reference/cli.md": cli_page.render,
    "reference/http-api.md": api_page.render,
    "reference/sql.md": sql_page.render,
    "reference/tables.md": tables_page.render,
    "reference/metrics.md": metrics_page.render,
}


def rendered() -> dict[str, str]:
    """Every page as the code says it now."""
    return {path: render() for path, render in PAGES.items()}


def stale(docs: Path = DOCS) -> list[str]:
    """The pages under ``docs`` that differ from what the code says now (or are missing)."""
    return [
        path
        for path, text in rendered().items()
        if not (docs / path).is_file() or (docs / path).read_text() != text
    ]


def write(docs: Path = DOCS) -> list[str]:
    """Write every page under ``docs``; returns the pages that changed."""
    changed = []
    for path, text in rendered().items():
        target = docs / path
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    return changed
