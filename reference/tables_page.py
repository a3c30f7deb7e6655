"""reference/tables.md: every table of the lake as ``lake/catalog.py`` declares it: its path
under ``LAKE_ROOT``, its SQL name, partitioning, writers, the comment above its declaration,
and its columns with their Arrow types."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from reference import markdown


def _comments_above(source: str) -> dict[str, str]:
    """Each module-level assignment's name -> the comment block right above it."""
    whole: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
            whole[token.start[0]] = token.string.lstrip("#").strip()
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name):
            line, block = node.lineno, list[str]()
            while line - 1 in whole:
                line -= 1
                block.insert(0, whole[line])
            found[target.id] = " ".join(block)
    return found


def _section(table: object, comment: str) -> Iterator[str]:
    from lake.catalog import MAINTAINED, SERVED, Table

    assert isinstance(table, Table)
    yield f"## `{table.name}`"
    yield ""
    facts = [f"SQL name {markdown.code(table.sql_name)}"]
    if table.partition_by:
        facts.append("partitioned by " + ", ".join(markdown.code(c) for c in table.partition_by))
    if table.summed_by:
        facts.append("partial counts, summed per " + ", ".join(table.summed_by) + " by readers")
    facts.append("served (SQL, API)" if table in SERVED else "not served")
    if table in MAINTAINED:
        facts.append("compacted and vacuumed by `ctr_maintenance`")
    yield "; ".join(facts) + "."
    yield ""
    if comment:
        yield comment
        yield ""
    if table.writers:
        yield "Written by: " + "; ".join(table.writers) + "."
        yield ""
    schema: pa.Schema = table.schema
    from lake.column_meanings import meaning

    rows = [[markdown.code(f.name), str(f.type), meaning(table.name, f.name) or ""] for f in schema]
    yield markdown.table(("column", "type", "meaning"), rows)


def tables() -> list[tuple[object, str]]:
    """Every table of the catalog, with the comment above its declaration, in source order;
    the per-version tables after them."""
    from lake import catalog

    comments = _comments_above(Path(catalog.__file__).read_text())
    found: list[tuple[object, str]] = []
    for name, value in vars(catalog).items():
        if isinstance(value, catalog.Table) and name.isupper():
            found.append((value, comments.get(name, "")))
    seen = {id(t) for t, _ in found}
    groups = {"VERSIONED": catalog.VERSIONED, "HOURS": catalog.HOURS}
    groups["REACH_CUBES"] = catalog.REACH_CUBES
    for table in (*catalog.VERSIONED, *catalog.HOURS, *catalog.REACH_CUBES):
        if id(table) not in seen:
            seen.add(id(table))
            group = next(name for name, members in groups.items() if table in members)
            found.append((table, comments.get(group, "")))
    return found


def render() -> str:
    """The tables page."""
    body: list[str] = []
    for table, comment in tables():
        body += [*_section(table, comment), ""]
    intro = (
        "The lake's Delta tables, each under `LAKE_ROOT` (a local path or `s3://bucket/prefix`). "
        "Readers get these schemas even before a table first exists; a column added later "
        "reads null in older rows, and a column an event kind does not fill (a key's role "
        "outside its created row, an alert's test figures outside an evaluation) is null "
        "there. Each column's meaning is `lake/column_meanings.py`'s. What the tables mean "
        "together: "
        "[Architecture and contracts](../concepts/architecture.md)."
    )
    return markdown.page("Tables", "`lake/catalog.py` and `lake/column_meanings.py`", intro, body)
