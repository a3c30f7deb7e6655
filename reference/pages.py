"""The generated pages, by their path in the site."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from reference import api_page, cli_page, settings_page, sql_page, tables_page

PAGES: Final[dict[str, Callable[[], str]]] = {
    "reference/configuration.md": settings_page.render,
    "reference/cli.md": cli_page.render,
    "reference/http-api.md": api_page.render,
    "reference/sql.md": sql_page.render,
    "reference/tables.md": tables_page.render,
}
