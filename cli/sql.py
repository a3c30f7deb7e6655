"""`ctr sql`: read-only SQL over the platform's views, one query or an interactive shell."""

from __future__ import annotations

import enum
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from cli.console import SafeConsole, console, printable, styled
from cli.tables import Listing, Wide, print_table

if TYPE_CHECKING:
    from serving_layer.sandbox.pool import SqlPool
    from serving_layer.snapshots import SnapshotSource


class Format(enum.StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def sql(
    query: Annotated[
        str | None,
        typer.Argument(
            metavar="QUERY", help="One read-only query; none starts an interactive shell."
        ),
    ] = None,
    output: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    max_rows: Annotated[int, typer.Option(min=1, help="Rows at most.")] = 10_000,
    timeout: Annotated[float, typer.Option(min=0.1, help="Time limit in seconds.")] = 60.0,
    memory: Annotated[
        str, typer.Option(help="Memory limit of the query's sandbox process (e.g. 2GiB).")
    ] = "1GiB",
    wide: Wide = False,
) -> None:
    """Query the lake's views with DuckDB, read-only, over the current snapshot of the lake:
    ctr (the merged view at minute grain), covered, stale, the batch and speed tables, the
    master tables, drift, the registry and each version's views (SHOW TABLES lists them; the
    SQL reference, docs/reference/sql.md, says what each holds).

    Queries run in a sandboxed worker process, as on the API: read-only, with the time and
    memory limits given here. A table printed to a pipe or a file is as wide as its rows
    (--wide); --format json prints the rows for scripts."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    from lake.settings import LakeSettings
    from serving_layer.sandbox.pool import SqlPool
    from serving_layer.snapshots import SnapshotSource

    try:
        memory_bytes = int(TypeAdapter(ByteSize).validate_python(memory))
    except ValidationError:
        raise typer.BadParameter(
            f"not a size: {memory!r} (e.g. 512MiB, 2GB)", param_hint="--memory"
        ) from None
    if memory_bytes < 64 * 2**20:
        raise typer.BadParameter("at least 64MiB", param_hint="--memory")
    source = SnapshotSource(LakeSettings(), refresh_s=0)
    pool = SqlPool(workers=1, queue_size=0, memory_bytes=memory_bytes)
    try:
        if query is not None:
            ran = _run(
                pool, source, query, output=output, max_rows=max_rows, timeout=timeout, wide=wide
            )
            if not ran:
                raise typer.Exit(1)
            return
        _shell(pool, source, output, max_rows, timeout, wide=wide)
    finally:
        pool.close()


def _run(
    pool: SqlPool,
    source: SnapshotSource,
    query: str,
    *,
    output: Format,
    max_rows: int,
    timeout: float,
    wide: bool = False,
) -> bool:
    from serving_layer.sandbox.database import SqlError, SqlRefusedError

    try:
        result = pool.run(
            query, source.current(), max_rows=max_rows, max_bytes=2**62, timeout_s=timeout
        )
    except SqlRefusedError as exc:
        console.print(styled("refused:", "bold red", f" {exc}"), soft_wrap=True)
        return False
    except SqlError as exc:
        console.print(styled("error:", "bold red", f" {exc}"), soft_wrap=True)
        return False
    _print(result.columns, result.rows, output, wide=wide)
    if result.truncated:
        console.print(f"(first {max_rows:,} rows shown; raise --max-rows for more)")
    return True


def _print(
    columns: list[str], rows: list[list[object]], output: Format, *, wide: bool = False
) -> None:
    if output is Format.csv:
        from serving_layer.csv_rows import csv_text

        text = csv_text(columns, rows)
        if sys.stdout.isatty():  # read by a person: the terminal shows controls, never obeys
            text = "\n".join(printable(line) for line in text.split("\r\n"))
        sys.stdout.write(text)
    elif output is Format.json:
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        print(json.dumps(records, indent=2))
    else:
        out = SafeConsole()
        # A pipe or a file: each row on one line, whatever its width.
        print_table(rows_listing(columns, rows), out, wide=wide or not out.is_terminal)
        console.print(f"{len(rows):,} row(s)")


def rows_listing(columns: list[str], rows: list[list[object]]) -> Listing:
    """A query's answer as a table: its columns wrap between words (any may be an id)."""
    listing = Listing(*columns)
    for row in rows:
        listing.add_row(*("NULL" if v is None else str(v) for v in row))
    return listing


def _shell(
    pool: SqlPool,
    source: SnapshotSource,
    output: Format,
    max_rows: int,
    timeout: float,
    *,
    wide: bool,
) -> None:
    import readline  # noqa: F401  (line editing and history for input())

    from serving_layer.sandbox.database import VIEW_NAMES

    console.print(
        f"ctr sql: read-only DuckDB over {', '.join(VIEW_NAMES)}. End a query with ';'. "
        ".format table|csv|json, .quit (or Ctrl-D)."
    )
    buffer: list[str] = []
    while True:
        try:
            line = input("...> " if buffer else "ctr> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            buffer.clear()
            continue
        stripped = line.strip()
        if not buffer and stripped.startswith("."):
            command, _, argument = stripped.partition(" ")
            if command in (".quit", ".exit"):
                return
            if command == ".format" and argument.strip() in Format.__members__:
                output = Format(argument.strip())
            else:
                console.print("commands: .format table|csv|json, .quit")
            continue
        buffer.append(line)
        if stripped.endswith(";"):
            query = "\n".join(buffer)
            _run(pool, source, query, output=output, max_rows=max_rows, timeout=timeout, wide=wide)
            buffer.clear()
