"""Terminal output shared by every layer's commands: errors, progress bars with live rates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

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

if TYPE_CHECKING:
    from runtime.streaming import StreamProgress

console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` to stderr and exit non-zero."""
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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
