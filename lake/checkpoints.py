"""A streaming job's checkpoint as the jobs' own code reads it: a local folder, or a prefix on
the lake's object store (``CHECKPOINT_ROOT=s3://…``), through one pyarrow filesystem either
way, so a driver restarted on another host reads what the last one wrote.

Spark's checkpoint holds, per micro-batch, the offsets it reads and the batch's metadata (its
event-time watermark and its timestamp) *before* the batch runs, so a replayed batch sees the
same values; the jobs use them to make their writes deterministic. What is read here is
bounded whatever the job's age: Spark keeps the last ``spark.sql.streaming.minBatchesToRetain``
(100) entries of each log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings, is_object_store
from runtime.streaming import BatchMetadata

if TYPE_CHECKING:
    import pyarrow.fs as pafs


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint at ``location`` (a local path or an object-store URI on ``store``)."""

    location: str
    store: ObjectStoreSettings

    @property
    def on_object_store(self) -> bool:
        return is_object_store(self.location)

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        filesystem, base = arrow_filesystem(self.location, self.store)
        return filesystem, base.rstrip("/")

    def read_text(self, relative: str) -> str:
        """The file ``relative`` (``offsets/7``) of the checkpoint; FileNotFoundError if none."""
        filesystem, base = self._fs()
        with filesystem.open_input_stream(f"{base}/{relative}") as source:
            return bytes(source.read()).decode()

    def exists(self) -> bool:
        """Whether a query has started on it (Spark wrote its ``metadata``)."""
        import pyarrow.fs as pafs

        filesystem, base = self._fs()
        return bool(filesystem.get_file_info(f"{base}/metadata").type == pafs.FileType.File)

    def query_id(self) -> str:
        """The query's id, kept in its checkpoint: a fresh checkpoint is a new application."""
        return str(json.loads(self.read_text("metadata"))["id"])

    def _offset_log_entry(self, batch_id: int) -> list[str]:
        """``offsets/N``: a version line, the batch metadata, then one JSON line per source."""
        lines = self.read_text(f"offsets/{batch_id}").splitlines()
        if len(lines) < 2 or not lines[0].startswith("v"):
            raise ValueError(f"unexpected offset log entry {self.location}/offsets/{batch_id}")
        return lines

    def batch_metadata(self, batch_id: int) -> BatchMetadata:
        """The offset log entry of ``batch_id`` (written before the batch runs)."""
        metadata = json.loads(self._offset_log_entry(batch_id)[1])
        return BatchMetadata(
            batch_id=batch_id,
            watermark_ms=int(metadata.get("batchWatermarkMs", 0)),
            timestamp_ms=int(metadata.get("batchTimestampMs", 0)),
        )

    def committed_offsets(self, topic: str) -> dict[int, int]:
        """Next offset per partition of ``topic`` after the checkpoint's last committed batch
        (``commits/N`` done; ``offsets/N`` what it read); empty if none committed yet."""
        import pyarrow.fs as pafs

        filesystem, base = self._fs()
        selector = pafs.FileSelector(f"{base}/commits", allow_not_found=True)
        commits = [
            int(info.base_name)
            for info in filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File and info.base_name.isdigit()
        ]
        if not commits:
            return {}
        for line in self._offset_log_entry(max(commits))[2:]:
            offsets = json.loads(line) if line.strip().startswith("{") else {}
            if topic in offsets:
                return {int(partition): int(next_) for partition, next_ in offsets[topic].items()}
        return {}

    def delete(self) -> None:
        """Remove the checkpoint and everything kept in it (nothing if it does not exist)."""
        import pyarrow.fs as pafs

        filesystem, base = self._fs()
        if filesystem.get_file_info(base).type != pafs.FileType.NotFound:
            filesystem.delete_dir(base)
