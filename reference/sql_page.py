"""reference/sql.md: what ``POST /api/v1/sql`` and ``ctr sql`` accept, from the sandbox's own
lists: the statements, the views each role gets, the columns hidden below admin, and every
function a query may call (anything else is refused before a worker sees the query)."""

from __future__ import annotations

from collections.abc import Iterator

from reference import markdown


def _views() -> Iterator[str]:
    from lake.catalog import SERVED_BY_NAME
    from serving_layer.sandbox.database import (
        RAW_VIEWS,
        SANDBOX_VIEWS,
        UNSCOPED_VIEWS,
        VERSION_VIEWS,
    )

    yield "## Views"
    yield ""
    yield (
        "Each is a Delta table of the lake (its path under `LAKE_ROOT`), read at one snapshot "
        "per query; `covered`, `stale` and `ctr` are the merged coverage, the arrivals no "
        "batch run has counted yet and the merged view, and so is each of them per version: "
        + ", ".join(markdown.code(v) for v in VERSION_VIEWS)
        + ". Their columns: [Tables](tables.md)."
    )
    yield ""
    rows = []
    for view, table in SANDBOX_VIEWS.items():
        analyst = "" if view in RAW_VIEWS else "yes"
        scoped = "campaign_id" in SERVED_BY_NAME[table].schema.names
        advertiser = (
            "" if view in RAW_VIEWS | UNSCOPED_VIEWS else "its campaigns' rows" if scoped else "yes"
        )
        rows.append([markdown.code(view), markdown.code(table), "yes", analyst, advertiser])
    header = ("view", "table", "admin", "analyst", "advertiser")
    yield markdown.table(header, rows)


def _hidden() -> Iterator[str]:
    from views.columns import SKETCHES, USER_BITMAPS, USER_LISTS, USER_NUMBERS

    yield "## Columns below admin"
    yield ""
    hidden = ", ".join(markdown.code(c) for c in (*USER_LISTS, *USER_NUMBERS, *USER_BITMAPS))
    sealed = ", ".join(markdown.code(c) for c in SKETCHES)
    yield (
        f"User-level data is an admin key's. For analyst and advertiser keys the columns {hidden} "
        f"are not in the views at all, and the sketch columns {sealed} are sealed: encrypted "
        "per query, they can only be unioned (`sketch_union`) and estimated "
        "(`sketch_estimate`), never read as bytes or matched against guessed ids "
        "(`views/sketches.py`, `SketchSeal`)."
    )
    yield ""


def _functions() -> Iterator[str]:
    from serving_layer.sandbox.functions import (
        ALLOWED_FUNCTIONS,
        ALLOWED_TABLE_FUNCTIONS,
        FUNCTION_GROUPS,
    )

    yield "## Functions"
    yield ""
    yield (
        f"{len(ALLOWED_FUNCTIONS)} functions and operators by kind, as DuckDB names them "
        "(lower case); a running server lists the same at `GET /api/v1/sql/functions`. "
        "Table functions: "
        + ", ".join(markdown.code(f) for f in sorted(ALLOWED_TABLE_FUNCTIONS))
        + ". Not here, so refused: file readers and globs, scans of Python or Arrow objects, "
        "`query()` and `query_table()`, catalog, settings, variables, sequences, sleep."
    )
    yield ""
    for kind, names in FUNCTION_GROUPS.items():
        yield f"### {kind}"
        yield ""
        yield ", ".join(markdown.code(n) for n in sorted(names))
        yield ""


def render() -> str:
    """The SQL page."""
    from serving_layer.sandbox.database import ALLOWED_STATEMENTS

    intro = (
        "Ad-hoc SQL (`ctr sql`, `POST /api/v1/sql`) runs in a sandbox: a fresh DuckDB database "
        "per query that can touch no file, in a worker process with a time, memory and answer "
        f"size limit. The rule, as the refusal says it: {ALLOWED_STATEMENTS}. "
        "How to query, with examples: [Querying](../guides/querying.md)."
    )
    body = [*_views(), *_hidden(), *_functions()]
    return markdown.page("SQL allow-list", "`serving_layer/sandbox/`", intro, body)
