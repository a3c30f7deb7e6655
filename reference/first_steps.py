"""The first steps, from one source: docs/getting-started.md's ``sh`` blocks (each opens with a
comment saying what it does), which its test runs. The README shows them (its block between
the markers is rewritten by ``make reference`` and checked by ``make docs`` and the unit tier),
and ``make demo``'s summary prints them with the running demo's address
(``python -m reference.first_steps --url URL``).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
PAGE: Final = ROOT / "docs" / "getting-started.md"
README: Final = ROOT / "README.md"
#: The address the page's commands use: the demo's API.
DEMO_URL: Final = "http://127.0.0.1:8000"
BEGIN: Final = "<!-- first steps: generated from docs/getting-started.md by `make reference` -->"
END: Final = "<!-- end of the first steps -->"
_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)


class FirstStepsError(ValueError):
    """The page or the README is not in the shape the generator reads."""


@dataclass(frozen=True)
class Step:
    what: str  # the block's opening comment, without '# '
    command: str  # the rest of the block, as the test runs it


def steps(page: str | None = None) -> list[Step]:
    """The page's ``sh`` blocks, in order; each must open with a ``# what it does`` line."""
    found = []
    for block in _BLOCK.findall(PAGE.read_text() if page is None else page):
        first, _, rest = block.partition("\n")
        if not first.startswith("# ") or not rest.strip():
            raise FirstStepsError(f"a sh block must open with '# what it does': {block!r}")
        found.append(Step(first[2:].strip(), rest.rstrip("\n")))
    return found


def commands(url: str = DEMO_URL, indent: str = "", page: str | None = None) -> str:
    """The steps as one shell script: the demo's settings, then each step numbered."""
    lines = ["source run/demo/env"]
    for number, step in enumerate(steps(page), 1):
        lines += ["", f"# {number}. {step.what}", step.command.replace(DEMO_URL, url)]
    return "\n".join(f"{indent}{line}" if line else "" for line in lines)


def readme_block(page: str | None = None) -> str:
    return f"{BEGIN}\n```sh\n{commands(page=page)}\n```\n{END}"


def readme(text: str, page: str | None = None) -> str:
    """``text`` (the README) with its block between the markers as the page says now."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise FirstStepsError(f"README.md has no block between {BEGIN!r} and {END!r}")
    return text[:begin] + readme_block(page) + text[end + len(END) :]


def readme_stale() -> bool:
    text = README.read_text()
    return readme(text) != text


def write_readme() -> bool:
    """Rewrite the README's block; True if it changed."""
    text = README.read_text()
    new = readme(text)
    if new != text:
        README.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reference.first_steps",
        description="Print the first steps of docs/getting-started.md (make demo's summary).",
    )
    parser.add_argument("--url", default=DEMO_URL, help=f"the API's address (default {DEMO_URL})")
    parser.add_argument("--indent", default="", help="put before every line")
    args = parser.parse_args(argv)
    print(commands(args.url, args.indent))


if __name__ == "__main__":
    main()
