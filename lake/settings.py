"""Where the Delta tables and the streaming checkpoints live.

The defaults are under the project's own ``data/`` folder, whichever directory a job starts
from (a relative default made a new, empty lake beside every other working directory); a
relative ``LAKE_ROOT`` or ``CHECKPOINT_ROOT`` given in the environment is taken from the
working directory, as usual for a path. ``LAKE_ROOT`` may also name an S3-compatible object store,
``s3://bucket/prefix``: the store's endpoint and credentials (the AWS variables) are read with
the lake's settings, at the entry point, into :attr:`LakeSettings.object_store`, which every
function touching the lake is given (:mod:`lake.storage`). ``CHECKPOINT_ROOT`` may name the same
store: the streaming jobs' checkpoints, the attribution state and the speed job's status then
live there too, so a driver restarted on another host finds them (hosts share nothing). A URL of
any other kind (``gs://``, ``hdfs://``) is refused, never taken as a folder name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.object_store import ObjectStoreSettings

PROJECT_DATA: Final = Path(__file__).resolve().parents[1] / "data"
_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _location(value: object, name: str) -> str:
    """A root as every client takes it: an absolute local path, or ``s3://bucket/prefix``;
    ValueError for a URL of another kind (it would be a folder named ``gs:`` otherwise)."""
    from lake.storage import to_delta_uri
    from runtime.object_store import is_object_store

    text = str(value)
    if is_object_store(text):
        return to_delta_uri(text).rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif _URL.match(text):
        raise ValueError(
            f"{name}: a local folder or an S3-compatible store (s3://bucket/prefix), got "
            f"{text!r}: that kind of URL cannot be used"
        )
    return str(Path(text).absolute())


class LakeSettings(BaseSettings):
    """``LAKE_ROOT`` (the Delta tables), ``CHECKPOINT_ROOT`` (Spark streaming state) and the
    object store the lake may live on."""

    model_config = SettingsConfigDict(extra="ignore")

    # Where the Delta tables are: a local folder (relative: to the working directory; default
    # the project's data/lake) or s3://bucket/prefix on the object store (the AWS variables).
    # Always held as a str.
    lake_root: str | Path = Field(default=str(PROJECT_DATA / "lake"), validation_alias="LAKE_ROOT")
    # Where the streaming jobs keep their progress (Spark's checkpoints, the speed job's
    # attribution state and its status): a local folder (relative: to the working directory;
    # default the project's data/checkpoints), or s3://bucket/prefix on the lake's object
    # store, where a driver restarted on another host finds them. Always held as a str.
    checkpoint_root: str | Path = Field(
        default=str(PROJECT_DATA / "checkpoints"), validation_alias="CHECKPOINT_ROOT"
    )
    # Hours of Delta log kept by the streaming-written tables (master/events, master/rejected,
    # master/arrivals): every log checkpoint (each 50 commits) deletes older entries.
    log_retention_hours: float = Field(
        default=24.0, gt=0, validation_alias="LAKE_LOG_RETENTION_HOURS"
    )
    # Hours of Delta log kept by the batch tables and the view registry (how far back as-of
    # queries reach), and how long a batch view remembers a run's and an hour's ids (a rerun
    # of an older run recomputes rather than committing nothing).
    history_retention_hours: float = Field(
        default=720.0, gt=0, validation_alias="LAKE_HISTORY_RETENTION_HOURS"
    )
    # Hours the data files of old versions are kept (every table but the speed layer's):
    # VACUUM (ctr_maintenance, the archiver's maintenance) deletes the files no version within
    # this window needs.
    vacuum_retention_hours: float = Field(
        default=168.0, gt=0, validation_alias="LAKE_VACUUM_RETENTION_HOURS"
    )
    # The store's settings, from the AWS variables when these settings are built (at the entry
    # point); its lake_root is always this lake's (_same_lake), so object_store.in_use holds.
    object_store: ObjectStoreSettings = Field(default_factory=ObjectStoreSettings)

    @field_validator("lake_root", mode="before")
    @classmethod
    def _locate(cls, value: object) -> str:
        return _location(value, "LAKE_ROOT")

    @field_validator("checkpoint_root", mode="before")
    @classmethod
    def _locate_checkpoints(cls, value: object) -> str:
        return _location(value, "CHECKPOINT_ROOT")

    @model_validator(mode="after")
    def _same_lake(self) -> LakeSettings:
        from runtime.object_store import is_object_store

        lake_root = str(self.lake_root)
        if self.object_store.lake_root != lake_root:
            self.object_store = self.object_store.model_copy(update={"lake_root": lake_root})
        if is_object_store(str(self.checkpoint_root)) and not self.on_object_store:
            raise ValueError(
                "CHECKPOINT_ROOT is on an object store but LAKE_ROOT is a local folder: the "
                "checkpoints go on the lake's store (LAKE_ROOT=s3://…), or on a local folder"
            )
        return self

    @property
    def on_object_store(self) -> bool:
        from runtime.object_store import is_object_store

        return is_object_store(str(self.lake_root))

    @property
    def checkpoints_on_object_store(self) -> bool:
        from runtime.object_store import is_object_store

        return is_object_store(str(self.checkpoint_root))

    def under(self, *parts: str) -> LakeSettings:
        """A lake of its own below this one (a replay's), its checkpoints likewise."""
        lake_root = "/".join([str(self.lake_root), *parts])
        return self.model_copy(
            update={
                "lake_root": lake_root,
                "checkpoint_root": "/".join([str(self.checkpoint_root), *parts]),
                "object_store": self.object_store.model_copy(update={"lake_root": lake_root}),
            }
        )

    def retention(self, table: str) -> dict[str, str]:
        """The retention table properties of ``table`` (e.g. ``"master/events"``)."""
        from lake.retention import STREAMING_TABLES, retention_properties

        streaming = table in STREAMING_TABLES
        if streaming:  # a writer's one application id, kept for good (its replays)
            return retention_properties(
                log_hours=self.log_retention_hours, files_hours=self.vacuum_retention_hours
            )
        return retention_properties(
            log_hours=self.history_retention_hours,
            files_hours=self.vacuum_retention_hours,
            transaction_hours=self.history_retention_hours,
        )

    def table(self, name: str) -> str:
        """Absolute location of a table, e.g. ``table("master/events")``."""
        return f"{self.lake_root}/{name}"

    def checkpoint(self, name: str) -> str:
        """Where the checkpoint ``name`` is: a local path or an object-store URI (what Spark's
        checkpointLocation, pyarrow and :class:`lake.checkpoints.Checkpoint` take)."""
        return f"{self.checkpoint_root}/{name}"
