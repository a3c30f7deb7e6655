"""`ctr speed`: keep speed/ctr fresh; `ctr speed status`: how it is doing."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer

from cli.console import (
    StreamDisplay,
    check_kafka_login,
    console,
    fail,
    log_lines_unless_a_terminal,
    printable,
    run_streaming_job,
    styled,
)
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from runtime.spark_settings import SparkSettings
from runtime.streaming import StreamProgress

app = typer.Typer(no_args_is_help=False, invoke_without_command=True)


@app.callback()
def speed(
    ctx: typer.Context,
    available_now: Annotated[
        bool,
        typer.Option(
            "--available-now", help="Process what the topic holds now, then exit (AvailableNow)."
        ),
    ] = False,
    reset: Annotated[
        bool,
        typer.Option(
            "--reset",
            help="Empty speed/ctr and speed/late and delete the speed checkpoint, then exit: the "
            "next start rebuilds them from the retained log.",
        ),
    ] = False,
) -> None:
    """Stream the event topic into speed/ctr: per-minute impressions and clicks, within seconds.

    Approximate by design: duplicates are counted, events later than the watermark
    (SPEED_WATERMARK, default 10 minutes) are dropped and counted in speed/late. The batch layer
    replaces these numbers with exact ones as it covers each interval. Progress is checkpointed
    under CHECKPOINT_ROOT: restart it any time. `ctr speed status` shows its health.
    """
    if ctx.invoked_subcommand is not None:
        return
    from speed_layer.job import reset as reset_speed
    from speed_layer.job import run as run_speed
    from speed_layer.settings import SpeedSettings

    kafka, lake, spark_settings = KafkaSettings(), LakeSettings(), SparkSettings()
    settings = SpeedSettings()
    if reset:
        reset_speed(lake, settings)
        console.print("speed/ctr and speed/late emptied, checkpoint deleted")
        return
    console.print(
        f"speed layer: {kafka.topic} from {kafka.bootstrap_servers} into "
        f"{lake.table('speed/ctr')} (watermark {settings.watermark}, trigger "
        f"{settings.trigger_seconds:g} s, checkpoint {lake.checkpoint(settings.checkpoint_name)})"
    )
    check_kafka_login(kafka)
    from runtime.metrics import MetricsSettings
    from runtime.spark import spark_session
    from runtime.stream_metrics import served

    log_lines_unless_a_terminal()
    metrics = served("speed", settings.metrics_port, MetricsSettings().host, kafka)
    spark = spark_session(spark_settings, lake.object_store)

    def duration(progress: StreamProgress) -> str:
        return f"{progress.batch_duration_ms} ms"

    total = run_streaming_job(
        run_speed,
        spark,
        StreamDisplay("starting", duration),
        metrics,
        kafka=kafka,
        lake=lake,
        settings=settings,
        available_now=available_now,
    )
    console.print(f"processed {total:,} records" + (" (caught up)" if available_now else ""))


@app.command()
def status(
    json_output: Annotated[bool, typer.Option("--json", help="Print the raw status JSON.")] = False,
) -> None:
    """Show the speed job's last reported micro-batch: rates, duration, lag, watermark."""
    import json

    from lake.speed_status import read_status, speed_status_path

    lake = LakeSettings()
    current = read_status(lake)
    if current is None:
        fail(
            f"no status at {speed_status_path(lake)}: the speed job has not run with this "
            "CHECKPOINT_ROOT"
        )
    if json_output:
        typer.echo(json.dumps(current.raw, indent=2))
        return
    updated = dt.datetime.fromisoformat(current["updated_at"])
    age = (dt.datetime.now(dt.UTC) - updated).total_seconds()
    behind = current.get("offsets_behind")
    lines = [
        f"last batch     {current['batch_id']} ({age:,.0f} s ago)",
        f"input rate     {current['input_rows_per_second']:,.0f} rows/s",
        f"processing     {current['processed_rows_per_second']:,.0f} rows/s",
        f"batch duration {current['batch_duration_ms']:,} ms",
        f"offsets behind {'unknown' if behind is None else f'{behind:,}'}",
        f"watermark      {current.get('watermark') or 'none yet'}",
        f"invalid        {current.get('invalid_records', 0):,} in the last batch",
    ]
    phases = current.get("phases_ms") or {}
    if phases:
        # Where the last batch's time went: Spark's trigger phases, then the callback's.
        shown = ", ".join(f"{name} {ms:,}" for name, ms in phases.items() if name != "view_rows")
        lines.append(f"phases (ms)    {shown}")
    typer.echo(printable("\n".join(lines)))  # the status is a file anyone with the lake writes
    if age > 60:
        console.print(
            styled("warning:", "yellow", f" no progress for {age:,.0f} s: is `ctr speed` running?")
        )
