"""The built site's link checker (``make docs`` runs it after the build): every internal link of
every page must reach a file of the site, and its ``#anchor`` an id on that page.

``python -m reference.links [SITE_DIR]`` prints each broken link with the page it is on and
exits 1 if there is one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Broken:
    page: str
    link: str
    why: str


class _Page(HTMLParser):
    """The links (``href`` of ``a``, ``src`` of ``img``) and ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        if tag == "a" and values.get("name"):
            self.ids.add(str(values["name"]))
        link = values.get("href") if tag in ("a", "link") else values.get("src")
        if link and tag in ("a", "img"):
            self.links.append(link)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def _target(site: Path, page: Path, path: str) -> Path:
    """The file a link's path names (a directory: its index.html)."""
    target = (page.parent / unquote(path)).resolve() if path else page
    if path.startswith("/"):
        target = (site / unquote(path).lstrip("/")).resolve()
    return target / "index.html" if target.is_dir() else target


def broken_links(site: Path) -> Iterator[Broken]:
    """Every internal link of the site's pages that reaches no file, or no id on its page."""
    site = site.resolve()
    parsed: dict[Path, _Page] = {}
    for page in sorted(site.rglob("*.html")):
        parsed[page] = parsed.get(page) or _parse(page)
        for link in parsed[page].links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue  # not ours to check: the site has no network in CI
            target = _target(site, page, parts.path)
            where = str(page.relative_to(site))
            if not target.is_file() or site not in target.parents:
                yield Broken(where, link, "no such file in the site")
                continue
            if parts.fragment and target.suffix == ".html":
                parsed[target] = parsed.get(target) or _parse(target)
                if unquote(parts.fragment) not in parsed[target].ids:
                    yield Broken(where, link, "no such anchor on the page")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference.links",
        description="Check the built docs site's internal links and anchors.",
    )
    parser.add_argument("site", nargs="?", default="site", type=Path, help="the built site")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"links: error: no site at {args.site} (make docs builds it)", file=sys.stderr)
        return 2
    found = list(broken_links(args.site))
    for item in found:
        print(f"{item.page}: {item.link}: {item.why}")
    pages = len(list(args.site.rglob("*.html")))
    print(f"links: {len(found)} broken internal links in {pages} pages of {args.site}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
