"""The MkDocs hook (mkdocs.yml ``hooks:``): adds the reference pages, generated from the code
at each build (:data:`reference.pages.PAGES`), to the site. They are never files under docs/."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

# MkDocs loads this file by its path: the project's packages from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference.pages import PAGES


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files
