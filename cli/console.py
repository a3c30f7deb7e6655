"""Terminal output shared by every layer's commands: errors, progress bars with live rates.

What ``ctr`` prints is often not its own text: a rule's webhook URL an advertiser typed, a site
id from the lake, a broker's error. Printed as Rich markup, ``[/bold]`` in such a value crashes
the command and ``[link=…]`` shows one URL and links another; printed raw, an escape sequence
sets the operator's window title or colours. So every console here is a :class:`SafeConsole`:
it reads no markup (styles come from :class:`rich.text.Text`, never from brackets in a string)
and shows control characters as escapes (:func:`printable`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol

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
    from runtime.stream_metrics import StreamMetrics
    from runtime.streaming import StreamProgress

# C0 and C1 controls but newline and tab, DEL, and the Unicode format characters that reorder
# or hide text (bidirectional overrides and isolates, zero-width marks, line separators).
_CONTROLS: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)


def printable(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``, ``\\u202e``):
    what a terminal displays, never what it obeys."""
    return _CONTROLS.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class SafeConsole(Console):
    """A Rich console that never reads markup, emoji codes or highlighting into a string it
    prints (a table's cells included) and escapes its control characters: any value may be
    printed as it is."""

    def __init__(self, **options: Any) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **options)

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(printable(text), **options)


console = SafeConsole(stderr=True)


def styled(label: str, style: str, rest: str = "") -> Text:
    """``label`` in ``style``, then ``rest`` as plain text (escaped): a styled prefix for a
    message that may carry anyone's text."""
    return Text.assemble((label, style), printable(rest))


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` to stderr and exit non-zero."""
    console.print(styled("error:", "bold red", f" {message}"), soft_wrap=True)
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
    columns: list[ProgressColumn | str] = [
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
    ]
    if total_known:
        columns += [BarColumn(), MofNCompleteColumn()]
    else:
        columns += [TextColumn("{task.completed:,.0f} " + unit, markup=False)]
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
    metrics: StreamMetrics | None = None,
    **arguments: Any,
) -> int:
    """Run a streaming job until caught up or Ctrl-C, with a progress display (and its
    ``metrics`` counted); its errors (lost records, a foreign table, ...) end the command with
    the message, no traceback."""
    with StopRequest() as stop, stream_bar(display.first, display.detail) as show:

        def on_progress(progress: StreamProgress) -> None:
            if metrics is not None:
                metrics.record(progress)
            show(progress)

        try:
            return job(
                spark, on_progress=on_progress, should_stop=lambda: stop.requested, **arguments
            )
        except RuntimeError as exc:
            fail(str(exc))
        finally:
            if metrics is not None:
                metrics.close()
