"""`ctr s3 …`: the local S3-compatible object store the lake may live on."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.console import console, fail

app = typer.Typer(
    help="Local S3-compatible object store (SeaweedFS) for LAKE_ROOT=s3://…; any S3 store "
    "by configuration (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).",
    no_args_is_help=True,
)


@app.command()
def up() -> None:
    """Start the local S3 server on 127.0.0.1 (CTR_S3_PORT, default 8333), create the bucket
    CTR_S3_BUCKET (default ctr-lake) and write RUN_DIR/s3/env; then:
    `source RUN_DIR/s3/env; LAKE_ROOT=s3://$CTR_S3_BUCKET/lake ctr …`. Objects live under
    RUN_DIR/s3/data and survive `ctr s3 down`. The first start builds the server (make setup
    does it too)."""
    from infra.s3 import LocalS3, LocalS3Settings, S3Error

    store = LocalS3(LocalS3Settings())
    console.print("s3: starting the local S3 server (SeaweedFS) …")
    try:
        started = store.start()
    except S3Error as exc:
        fail(str(exc))
    state = "started" if started else "already running"
    console.print(
        f"s3: {state} at {store.settings.endpoint} (pid {store.pid()}), bucket "
        f"{store.settings.bucket}, data under {store.dir / 'data'}"
    )
    console.print(f"s3: clients: source {store.env_file}")


@app.command()
def down(
    delete_data: Annotated[
        bool, typer.Option("--delete-data", help="Also delete RUN_DIR/s3: every object goes.")
    ] = False,
) -> None:
    """Stop the local S3 server started by `ctr s3 up` (its data stays unless --delete-data)."""
    import shutil

    from infra.s3 import LocalS3, LocalS3Settings

    store = LocalS3(LocalS3Settings())
    stopped = store.stop()
    message = "s3: stopped" if stopped else "s3: was not running"
    if delete_data:
        shutil.rmtree(store.dir, ignore_errors=True)
        message += f"; deleted {store.dir}"
    console.print(message)


@app.command()
def status() -> None:
    """Whether the local S3 server runs, and where."""
    from infra.s3 import LocalS3, LocalS3Settings

    store = LocalS3(LocalS3Settings())
    pid = store.pid()
    if pid is None:
        console.print("s3: not running")
        raise typer.Exit(3)
    console.print(f"s3: running at {store.settings.endpoint} (pid {pid}); env: {store.env_file}")
