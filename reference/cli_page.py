"""reference/cli.md: the ``ctr`` command tree as Typer builds it (the same Click commands
``ctr … --help`` prints), each command with its usage, its help and its options."""

from __future__ import annotations

from collections.abc import Iterator

import typer

# Typer (0.29) vendors Click: its commands are these classes, not the click package's.
from typer._click.core import Command, Context, Parameter

from reference import markdown


def _tree(command: Command, path: str) -> Iterator[tuple[str, Command]]:
    yield path, command
    # A group is a command with commands (Typer's group class is not exported).
    commands: dict[str, Command] = getattr(command, "commands", {})
    for name, sub in commands.items():
        if not sub.hidden:
            yield from _tree(sub, f"{path} {name}")


def _row(param: Parameter, context: Context) -> list[object]:
    """The option's line of ``--help``: its names and value, its help with default and range."""
    record = param.get_help_record(context)
    names, text = record if record else ((param.name or "").upper(), "")
    if param.param_type_name == "argument":
        text = f"(argument) {getattr(param, 'help', None) or text}"
    return [markdown.code(names), text.replace("  [", " [")]


def _section(path: str, command: Command) -> Iterator[str]:
    depth = min(path.count(" ") + 2, 4)
    yield f"{'#' * depth} `{path}`"
    yield ""
    # A fixed width: the page must not depend on the terminal it is generated in.
    context = command.context_class(
        command, info_name=path, terminal_width=100, max_content_width=100
    )
    yield f"```\n{command.get_usage(context).strip()}\n```"
    yield ""
    if command.help:
        yield command.help.strip().replace("\b\n", "")
        yield ""
    params = [
        p
        for p in command.get_params(context)
        if p.name != "help" and not getattr(p, "hidden", False)
    ]
    if params:
        yield markdown.table(("option", "meaning"), [_row(p, context) for p in params])


def render() -> str:
    """The command line page."""
    from cli.main import app

    root = typer.main.get_command(app)
    body: list[str] = []
    for path, command in _tree(root, "ctr"):
        body += [*_section(path, command), ""]
    intro = (
        "`ctr` is the platform's one command line (installed into `.venv/bin` by `make setup`; "
        "`source run/demo/env` puts it on the `PATH`). Every command prints its own `--help`; "
        "settings that are not options come from the environment: "
        "[Configuration](configuration.md). A usage error exits with status 2, a failure with "
        "status 1 and a one-line `error:` naming its cause. A command that prints a table fits "
        "it to the terminal (80 columns and up): the values that tell its rows apart (ids, "
        "names, scopes) stay whole, other columns wrap; `--wide` prints it at the width it "
        "needs, a row a line, and `--json` prints one JSON document instead, every value in "
        "full under stable keys (`ctr sql`: `--format json`)."
    )
    return markdown.page("Command line", "the `ctr` command tree, `cli/`", intro, body)
