"""`ctr`: one command line for the platform; one module of cli/ per command group."""

from __future__ import annotations

import contextlib
import sys
from typing import NoReturn

import typer
from pydantic import ValidationError

from cli import alerts, archive, batch, ingest, kafka, keys, s3, serve, speed, sql, views
from cli.console import printable
from runtime.errors import CtrError, foreign_or_ours, reason_of

app = typer.Typer(
    name="ctr",
    help="ctr-lambda: ad click-through analytics on a Lambda architecture "
    "(Kafka -> batch and speed layers -> serving layer).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(kafka.app, name="kafka")
app.add_typer(s3.app, name="s3")
app.command()(ingest.produce)
app.command()(ingest.replay)
app.command()(archive.archive)
app.command()(batch.batch)
app.command()(batch.backfill)
app.add_typer(speed.app, name="speed")
app.command()(serve.serve)
app.command()(sql.sql)
app.add_typer(views.app, name="views")
app.add_typer(keys.app, name="keys")
app.add_typer(alerts.app, name="alerts")


def main() -> None:
    try:
        code = _run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    _leave(code)


def _run() -> int:
    try:
        _private_files()
        app()
    except ValidationError as exc:
        # A bad environment variable: say which, without a traceback.
        print(printable(f"error: invalid configuration:\n{exc}"), file=sys.stderr)
        return 2
    except Exception as exc:
        if not foreign_or_ours(exc):
            raise  # a defect: its traceback is what a report needs
        # One of ours says its cause and the fix; Spark's, delta-rs's or Kafka's, in one line.
        said = exc if isinstance(exc, CtrError) else reason_of(exc)
        print(printable(f"error: {said}"), file=sys.stderr)
        return 1
    return 0


def _leave(code: int) -> NoReturn:
    """End the process with ``code`` once its exit handlers ran and its output is flushed,
    without the native runtimes' teardown: delta-rs' background threads, still up when the
    interpreter tears down, abort a command that did its work ("terminate called without an
    active exception", exit 134: about one run in thirty here; delta-io/delta-rs#2184)."""
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _private_files() -> None:
    """Owner-only files from here on (:mod:`runtime.private`): the umask, the local lake's
    roots, and the run directory (a bad lake setting is the command's to report)."""
    import os
    from pathlib import Path

    from lake.settings import LakeSettings
    from runtime.private import close_run_dir, owner_only, umask_setting

    try:
        lake = LakeSettings()
        roots: list[str | Path | None] = [lake.lake_root, lake.checkpoint_root]
    except ValidationError:
        roots = []
    mask = umask_setting(os.environ)
    owner_only(roots, mask)
    close_run_dir(os.environ.get("RUN_DIR"), mask)
