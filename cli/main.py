"""`ctr`: one command line for the platform; each layer owns its subcommands."""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

from api import cli as api_cli
from batch_layer import cli as batch_cli
from infra import cli as infra_cli
from ingest import cli as ingest_cli
from master_dataset import cli as master_cli
from serving_layer import cli as serving_cli

app = typer.Typer(
    name="ctr",
    help="ctr-lambda: ad click-through analytics on a Lambda architecture "
    "(Kafka -> batch and speed layers -> serving layer).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(infra_cli.app, name="kafka")
app.command()(ingest_cli.produce)
app.command()(ingest_cli.replay)
app.command()(master_cli.archive)
app.command()(batch_cli.batch)
app.command()(batch_cli.backfill)
app.command()(api_cli.serve)
app.command()(serving_cli.sql)


def main() -> None:
    try:
        app()
    except ValidationError as exc:
        # A bad environment variable: say which, without a traceback.
        print(f"error: invalid configuration:\n{exc}", file=sys.stderr)
        sys.exit(2)
