"""The environment variables read outside the settings classes: ``${NAME:-default}`` in the
shell scripts and the Makefile, ``environ.get("NAME")`` in Python, each with its default as
written, where it is read, and its ``#:`` doc comment (above or beside a line that reads it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from reference import markdown

_SHELL: Final = re.compile(r"\$\{([A-Z][A-Z0-9_]*):-((?:[^{}]|\{[^{}]*\})*)\}")
_PYTHON: Final = re.compile(
    r"""(?:environ\.get|environ\[|getenv|number)\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
    r"""(?:\s*,\s*([^,()]+?)\s*\))?"""
)
# Set by the platform for its own processes, or the system's: not knobs.
_INTERNAL: Final = frozenset({"CTR_DEMO_RUN", "HOME", "PWD", "PATH", "XDG_CACHE_HOME", "DEMO"})


@dataclass
class Variable:
    name: str
    defaults: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    meaning: str = ""


def _sources(root: Path) -> Iterator[Path]:
    yield root / "Makefile"
    yield from sorted((root / "infra").rglob("*.sh"))
    for package in ("infra", "cli", "bench", "dags"):
        yield from sorted((root / package).rglob("*.py"))


def _doc_for(lines: list[str], index: int) -> str:
    """The ``#:`` doc comment of line ``index``: the block of ``#:`` lines right above it, or a
    ``#:`` comment at its end (the convention Sphinx reads for attributes)."""
    block: list[str] = []
    above = index
    while above > 0 and lines[above - 1].lstrip().startswith("#:"):
        above -= 1
        block.insert(0, lines[above].lstrip()[2:].strip())
    if not block and "#: " in lines[index]:
        block = [lines[index].split("#: ", 1)[1].strip()]
    return " ".join(block)


def scan(root: Path) -> dict[str, Variable]:
    """Every variable :func:`_sources` read, by name."""
    found: dict[str, Variable] = {}
    for path in _sources(root):
        lines = path.read_text().splitlines()
        pattern = _PYTHON if path.suffix == ".py" else _SHELL
        for index, line in enumerate(lines):
            for match in pattern.finditer(line):
                name = match.group(1)
                if name in _INTERNAL:
                    continue
                variable = found.setdefault(name, Variable(name))
                variable.files.add(str(path.relative_to(root)))
                if pattern is _SHELL or match.group(2) is not None:
                    variable.defaults.add((match.group(2) or "").strip("\"'"))
                variable.meaning = variable.meaning or _doc_for(lines, index)
    return found


def other_variables(root: Path, declared: set[str]) -> Iterator[str]:
    """The page section of the variables of :func:`scan` that no settings class declares."""
    rows = []
    for name, variable in sorted(scan(root).items()):
        if name in declared:
            continue
        defaults = ", ".join(markdown.code(d) if d else "empty" for d in sorted(variable.defaults))
        files = ", ".join(markdown.code(f) for f in sorted(variable.files))
        rows.append([markdown.code(name), defaults or "unset", files, variable.meaning])
    yield "## Variables the scripts read"
    yield ""
    yield (
        "Read by the shell scripts and tools themselves, not by a settings class: "
        "`make demo`, `make soak`, Airflow's and the S3 server's helpers, the benchmarks. "
        "A default names what the script falls back to, as it is written there; the meaning "
        "is the variable's `#:` doc comment in the script that reads it."
    )
    yield ""
    yield markdown.table(("variable", "default", "read in", "meaning"), rows)
