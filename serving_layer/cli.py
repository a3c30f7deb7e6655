"""`ctr sql`: read-only SQL over the platform's views, one query or an interactive shell."""

from __future__ import annotations

import csv
import enum
import json
import sys
from typing import Annotated

import typer

from cli.console import console


class Format(enum.StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def sql(
    query: Annotated[
        str | None, typer.Argument(help="One read-only query; none starts an interactive shell.")
    ] = None,
    output: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    max_rows: Annotated[int, typer.Option(min=1, help="Rows at most.")] = 10_000,
    timeout: Annotated[float, typer.Option(min=0.1, help="Time limit in seconds.")] = 60.0,
) -> None:
    """Query events, rejected, ctr_batch, ctr_speed, coverage, covered and ctr (the merged view
    at minute grain) with DuckDB, read-only, over the current snapshot of the lake."""
    from infra.lake import LakeSettings
    from serving_layer.tables import SnapshotSource

    source = SnapshotSource(LakeSettings(), refresh_s=0)
    if query is not None:
        if not _run(source, query, output, max_rows, timeout):
            raise typer.Exit(1)
        return
    _shell(source, output, max_rows, timeout)


def _run(source: object, query: str, output: Format, max_rows: int, timeout: float) -> bool:
    from serving_layer.sandbox import SqlError, SqlRefusedError, run_sql
    from serving_layer.tables import SnapshotSource

    assert isinstance(source, SnapshotSource)
    try:
        result = run_sql(query, source.current(), max_rows=max_rows, timeout_s=timeout)
    except SqlRefusedError as exc:
        console.print(f"[bold red]refused:[/] {exc}", highlight=False, soft_wrap=True)
        return False
    except SqlError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return False
    _print(result.columns, result.rows, output)
    if result.truncated:
        console.print(f"(first {max_rows:,} rows shown; raise --max-rows for more)")
    return True


def _print(columns: list[str], rows: list[tuple[object, ...]], output: Format) -> None:
    from api.rendering import jsonable

    if output is Format.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows([jsonable(v) for v in row] for row in rows)
    elif output is Format.json:
        records = [dict(zip(columns, (jsonable(v) for v in row), strict=True)) for row in rows]
        print(json.dumps(records, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(*columns, show_lines=False)
        for row in rows:
            table.add_row(*("NULL" if v is None else str(jsonable(v)) for v in row))
        Console().print(table)
        console.print(f"{len(rows):,} row(s)")


def _shell(source: object, output: Format, max_rows: int, timeout: float) -> None:
    import readline  # noqa: F401  (line editing and history for input())

    from serving_layer.sandbox import SANDBOX_VIEWS

    views = ", ".join([*SANDBOX_VIEWS, "covered", "ctr"])
    console.print(
        f"ctr sql: read-only DuckDB over {views}. End a query with ';'. "
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
            _run(source, "\n".join(buffer), output, max_rows, timeout)
            buffer.clear()
