"""The speed job's health, as a small JSON file others read (`ctr speed status`, the API, the
alerts runner).

Written by the streaming job after every micro-batch to ``{CHECKPOINT_ROOT}/speed.status.json``
(replaced atomically: a rename on a local disk, one PUT on an object store; a reader never sees
half a file). With ``CHECKPOINT_ROOT`` on the object store, every API replica and the alerts
runner read it from any host. Its format, its writer and its one reader (:func:`read_status`:
typed fields for the API, the whole record for `ctr speed status` and the benchmarks) live here
together.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lake.settings import LakeSettings
from lake.storage import arrow_filesystem
from runtime.streaming import StreamProgress

STATUS_FILE = "speed.status.json"


def speed_status_path(lake: LakeSettings) -> str:
    """Where the status is: a local path, or an object-store URI."""
    return f"{lake.checkpoint_root}/{STATUS_FILE}"


def status_stamp(lake: LakeSettings) -> tuple[int, int] | None:
    """The status file's modification time and size (None: there is none): what a reader
    compares to know whether to read it again."""
    import pyarrow.fs as pafs

    filesystem, path = arrow_filesystem(speed_status_path(lake), lake.object_store)
    try:
        info = filesystem.get_file_info(path)
    except OSError:
        return None
    if info.type != pafs.FileType.File:
        return None
    return (info.mtime_ns or 0, info.size or 0)


def write_status(
    lake: LakeSettings,
    progress: StreamProgress,
    *,
    now: dt.datetime | None = None,
    phases: dict[str, int] | None = None,
    watermark_delay_ms: int | None = None,
) -> None:
    now = now or dt.datetime.now(dt.UTC)
    invalid = progress.metrics.get("speed.invalid", 0)
    status = {
        "updated_at": now.isoformat(),
        "batch_id": progress.batch_id,
        "input_rows": progress.input_rows,
        "watermark": progress.watermark.isoformat() if progress.watermark else None,
        # The watermark's delay (SPEED_WATERMARK): the watermark plus it is the newest event
        # time the earlier batches read (how far the job has read, in event time).
        "watermark_delay_ms": watermark_delay_ms,
        "offsets_behind": progress.offsets_behind,
        "input_rows_per_second": round(progress.input_rows_per_second, 1),
        "processed_rows_per_second": round(progress.processed_rows_per_second, 1),
        "batch_duration_ms": progress.batch_duration_ms,
        "invalid_records": invalid,
        "invalid_records_total": _invalid_total(read_status(lake), progress.batch_id, invalid),
        # Where the batch's time went, in milliseconds (`ctr speed status` shows them).
        "phases_ms": phases or {},
    }
    _replace(lake, json.dumps(status, indent=2).encode())


def _replace(lake: LakeSettings, data: bytes) -> None:
    """The status file replaced by ``data`` in one step."""
    import pyarrow.fs as pafs

    filesystem, path = arrow_filesystem(speed_status_path(lake), lake.object_store)
    if not isinstance(filesystem, pafs.LocalFileSystem):
        with filesystem.open_output_stream(path) as sink:  # one PUT: there or not at all
            sink.write(data)
        return
    directory = os.path.dirname(path)
    filesystem.create_dir(directory, recursive=True)
    scratch = f"{path}.{os.getpid()}.tmp"
    with filesystem.open_output_stream(scratch) as sink:
        sink.write(data)
    filesystem.move(scratch, path)


def _invalid_total(previous: SpeedStatus | None, batch_id: int, invalid: int) -> int:
    """Invalid records over every batch reported since the checkpoint began (a batch reported
    twice counts once; a lower batch id means a new checkpoint, so the count starts again)."""
    if previous is None:
        return invalid
    last_batch, total = previous.get("batch_id"), previous.get("invalid_records_total")
    if type(last_batch) is not int or type(total) is not int or batch_id < last_batch:
        return invalid
    return total if batch_id == last_batch else total + invalid


@dataclass(frozen=True)
class SpeedStatus:
    """What the streaming job last reported (``{CHECKPOINT_ROOT}/speed.status.json``)."""

    updated_at: dt.datetime
    batch_id: int | None
    watermark: dt.datetime | None
    offsets_behind: int | None
    input_rows_per_second: float | None
    processed_rows_per_second: float | None
    batch_duration_ms: int | None
    invalid_records_total: int | None = None
    watermark_delay_ms: int | None = None
    # The whole record as written (phases, rates, …): ``status["phases_ms"]``.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def newest_event(self) -> dt.datetime | None:
        """The newest event time the job had read before its last report (None: unknown)."""
        if self.watermark is None or self.watermark_delay_ms is None:
            return None
        return self.watermark + dt.timedelta(milliseconds=self.watermark_delay_ms)

    def __getitem__(self, name: str) -> Any:
        return self.raw[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.raw.get(name, default)


def read_status(lake: LakeSettings) -> SpeedStatus | None:
    """The last status the job wrote, or None if it never ran or the file is unreadable (it
    is advisory: half-written or from another version, no status rather than an error)."""
    try:
        filesystem, path = arrow_filesystem(speed_status_path(lake), lake.object_store)
        with filesystem.open_input_stream(path) as source:
            raw = json.loads(bytes(source.read()))
        return SpeedStatus(
            updated_at=_time(raw["updated_at"]) or dt.datetime.min.replace(tzinfo=dt.UTC),
            batch_id=_int(raw.get("batch_id")),
            watermark=_time(raw.get("watermark")),
            offsets_behind=_int(raw.get("offsets_behind")),
            input_rows_per_second=_float(raw.get("input_rows_per_second")),
            processed_rows_per_second=_float(raw.get("processed_rows_per_second")),
            batch_duration_ms=_int(raw.get("batch_duration_ms")),
            invalid_records_total=_int(raw.get("invalid_records_total")),
            watermark_delay_ms=_int(raw.get("watermark_delay_ms")),
            raw=raw,
        )
    except (OSError, ValueError, KeyError, TypeError):
        # Half-written or from another version: no status rather than a failed request.
        return None


def _time(value: object) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(value)
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)


def _int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    return int(value)


def _float(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    return float(value)
