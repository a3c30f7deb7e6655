"""The MkDocs hook (mkdocs.yml ``hooks:``): before a build, the reference pages under
docs/reference/ must be what the code says now (:func:`reference.pages.stale`), and the
README's first steps what docs/getting-started.md says (:mod:`reference.first_steps`); one that
is not fails the build, naming the command that rewrites it (``make reference``)."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import Abort

# MkDocs loads this file by its path: the project's packages from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference.first_steps import readme_stale
from reference.pages import stale


def on_pre_build(config: MkDocsConfig) -> None:
    found = stale(Path(config.docs_dir))
    if readme_stale():
        raise Abort(
            "README.md: its first steps differ from docs/getting-started.md's; "
            "`make reference` rewrites them"
        )
    if found:
        pages = ", ".join(f"docs/{path}" for path in found)
        raise Abort(f"{pages}: out of date with the code; `make reference` rewrites them")
