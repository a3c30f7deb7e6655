"""Replay a file of events into Kafka: JSON Lines, or CSV with a header row.

event_time is preserved. Records are validated by the producer; an invalid line goes to the
dead-letter topic untouched, with its reason and ``FILE:LINE`` as its source.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from events.model import FIELDS
from ingest.producer import EventProducer
from runtime.shutdown import StopRequest

FileFormat = Literal["jsonl", "csv"]
_INTEGER_FIELDS = frozenset({"event_time", "schema_version"})


@dataclass(frozen=True)
class ReplaySummary:
    lines: int
    sent: int
    dead_lettered: int
    seconds: float
    stopped_by: str | None


def detect_format(path: Path) -> FileFormat:
    return "csv" if path.suffix.lower() == ".csv" else "jsonl"


def read_lines(path: Path, file_format: FileFormat) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, record value) for each non-blank line.

    A CSV row is turned into the JSON record it stands for (integers for event_time and
    schema_version where they parse, empty cells left out) so the producer judges it like any
    other record; a row it cannot read is passed on as its raw text, to be dead-lettered.
    """
    with path.open("rb") as handle:
        header: list[str] | None = None
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            if file_format == "jsonl":
                yield number, line
                continue
            if header is None:
                header = next(csv.reader([line.decode("utf-8", "replace")]))
                unknown = [name for name in header if name not in FIELDS]
                if unknown:
                    raise ValueError(f"{path}: unknown CSV column(s) {unknown}; expected {FIELDS}")
                continue
            try:
                cells = next(csv.reader([line.decode("utf-8")]))
            except (UnicodeDecodeError, csv.Error):
                yield number, line
                continue
            if len(cells) != len(header):
                yield number, line
                continue
            record: dict[str, object] = {}
            for name, cell in zip(header, cells, strict=True):
                if cell == "":
                    continue
                record[name] = int(cell) if name in _INTEGER_FIELDS and _is_int(cell) else cell
            yield number, orjson.dumps(record)


def replay(
    path: Path,
    producer: EventProducer,
    *,
    file_format: FileFormat | None = None,
    speed: float | None = None,
    stop: StopRequest | None = None,
    on_progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ReplaySummary:
    """Send every line of ``path``; with ``speed``, keep the original event-time spacing
    divided by ``speed`` (2.0 = twice as fast as it happened)."""
    if speed is not None and speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    file_format = file_format or detect_format(path)
    start = clock()
    first_event_ms: int | None = None
    lines = sent = dead = 0
    stopped_by = None
    for number, value in read_lines(path, file_format):
        if stop is not None and stop.requested:
            stopped_by = stop.signal_name
            break
        event_time = _event_time_of_json(value) if speed is not None else None
        if speed is not None and event_time is not None:
            if first_event_ms is None:
                first_event_ms = event_time
            ahead = start + (event_time - first_event_ms) / 1000 / speed - clock()
            if ahead > 0.001:
                producer.poll(ahead)
        if producer.send(value, source=f"{path.name}:{number}"):
            sent += 1
        else:
            dead += 1
        lines += 1
        if on_progress is not None and lines % 256 == 0:
            on_progress(lines)
    if on_progress is not None:
        on_progress(lines)
    return ReplaySummary(lines, sent, dead, clock() - start, stopped_by)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _event_time_of_json(line: bytes) -> int | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    value = obj.get("event_time") if isinstance(obj, dict) else None
    return value if type(value) is int else None
