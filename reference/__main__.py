"""``python -m reference`` (`make reference`): write the docs' reference pages from the code
and the README's first steps from docs/getting-started.md;
with ``--check``, only say which are out of date (exit 1 if one is)."""

from __future__ import annotations

import argparse
import sys

from reference.first_steps import readme_stale, write_readme
from reference.pages import DOCS, PAGES, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page is out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for path in found:
            print(f"reference: docs/{path} is out of date with the code: run `make reference`")
        if readme_stale():
            print("reference: README.md's first steps are out of date: run `make reference`")
        return 1 if found or readme_stale() else 0
    changed = write()
    if write_readme():
        print("reference: README.md's first steps rewritten from docs/getting-started.md")
    print(f"reference: {len(changed)} of {len(PAGES)} pages under {DOCS} rewritten"
          + (f": {', '.join(changed)}" if changed else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
