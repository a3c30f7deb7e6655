"""Terminal output shared by every layer's commands: errors, progress bars with live rates."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from runtime.shutdown import StopRequest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lake.settings import LakeSettings
    from runtime.kafka_settings import KafkaSettings
    from runtime.streaming import StreamProgress

console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` to stderr and exit non-zero."""
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def check_kafka_login(kafka: KafkaSettings) -> None:
    """End the command with the cause if the cluster refuses these settings' login (wrong or
    missing credentials): a Spark job would otherwise retry for minutes saying only that the
    broker disconnected. No broker at all is left to the job's own retries."""
    from runtime.topics import KafkaAuthenticationError, check_login

    try:
        check_login(kafka)
    except KafkaAuthenticationError as exc:
        fail(str(exc))


class RateColumn(ProgressColumn):
    """Live rate of the task, e.g. ``12,345 events/s``."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} {self.unit}/s", style="cyan")


def progress_bar(unit: str, *, total_known: bool) -> Progress:
    """A progress bar (count known) or a spinner with a counter (count unknown)."""
    columns: list[ProgressColumn | str] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total_known:
        columns += [BarColumn(), MofNCompleteColumn()]
    else:
        columns += [TextColumn("{task.completed:,.0f} " + unit)]
    columns += [RateColumn(unit), TimeElapsedColumn()]
    if total_known:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, speed_estimate_period=5.0)


@contextmanager
def stream_bar(
    first: str, detail: Callable[[StreamProgress], str]
) -> Iterator[Callable[[StreamProgress], None]]:
    """A spinner counting a streaming job's rows; yields the ``on_progress`` callback, which
    describes each micro-batch as ``batch N: <detail>, M behind``."""
    with progress_bar("rows", total_known=False) as bar:
        task = bar.add_task(first)
        rows = 0

        def show(progress: StreamProgress) -> None:
            nonlocal rows
            rows += progress.input_rows
            lag = progress.offsets_behind
            behind = "" if lag is None else f", {lag:,} behind"
            description = f"batch {progress.batch_id}: {detail(progress)}{behind}"
            bar.update(task, completed=rows, description=description)

        yield show


class StreamingJob(Protocol):
    def __call__(
        self,
        spark: SparkSession,
        *,
        kafka: KafkaSettings,
        lake: LakeSettings,
        settings: Any,
        available_now: bool = False,
        on_progress: Callable[[StreamProgress], None] | None = None,
        should_stop: Callable[[], bool] = ...,
    ) -> int: ...


@dataclass(frozen=True)
class StreamDisplay:
    """How ``ctr archive``/``ctr speed`` show a running job: the spinner's first words and
    the detail of each micro-batch."""

    first: str
    detail: Callable[[StreamProgress], str]


def log_lines_unless_a_terminal() -> None:
    """Under a supervisor or into a log file (no terminal for the progress bar): the job's own
    log lines (a line per batch with its phases, its maintenance passes) with their time."""
    if not console.is_terminal:
        logging.basicConfig(
            level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        logging.getLogger("ctr").setLevel(logging.INFO)


def run_streaming_job(
    job: StreamingJob,
    spark: SparkSession,
    display: StreamDisplay,
    **arguments: Any,
) -> int:
    """Run a streaming job until caught up or Ctrl-C, with a progress display; its errors
    (lost records, a foreign table, ...) end the command with the message, no traceback."""
    with StopRequest() as stop, stream_bar(display.first, display.detail) as show:
        try:
            return job(spark, on_progress=show, should_stop=lambda: stop.requested, **arguments)
        except RuntimeError as exc:
            fail(str(exc))
