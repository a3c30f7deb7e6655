"""What a Spark streaming query's checkpoint holds on the object store: its objects and bytes,
the state store's apart (``state/<operator>/<partition>/``), and per state partition what a cold
load must fetch by the RocksDB provider's rule (Spark's ``RocksDBFileManager``): the newest
snapshot (``<version>.zip``), the SST files its metadata names (``SSTs/``) and the changelogs
after it (``<version>.changelog``, changelog checkpointing)."""

from __future__ import annotations

import io
import json
import re
import zipfile
from typing import Any, Final

import pyarrow.fs as pafs

from lake.storage import arrow_filesystem
from runtime.object_store import ObjectStoreSettings

_VERSIONED: Final = re.compile(r"^(\d+)(?:_[0-9A-Za-z-]+)?\.(zip|changelog)$")
_PARTITION: Final = re.compile(r"^state/(\d+)/(\d+)/(.+)$")


def checkpoint_objects(checkpoint: str, store: ObjectStoreSettings) -> dict[str, Any]:
    """The checkpoint's objects and bytes: all, the state store's, and per state partition
    (``restore``: what a cold load fetches)."""
    filesystem, base = arrow_filesystem(checkpoint, store)
    base = base.rstrip("/")
    selector = pafs.FileSelector(base, allow_not_found=True, recursive=True)
    files = {
        info.path.removeprefix(base + "/"): int(info.size or 0)
        for info in filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File
    }
    state = {path: size for path, size in files.items() if path.startswith("state/")}
    partitions: dict[str, dict[str, int]] = {}
    for path, size in state.items():
        if match := _PARTITION.match(path):
            partitions.setdefault(f"{match[1]}/{match[2]}", {})[match[3]] = size
    return {
        "objects": len(files),
        "bytes": sum(files.values()),
        "state_objects": len(state),
        "state_bytes": sum(state.values()),
        "engine_objects": {
            folder: sum(1 for p in files if p.startswith(f"{folder}/"))
            for folder in ("offsets", "commits", "sources")
        },
        "partitions": {
            name: {
                "objects": len(held),
                "bytes": sum(held.values()),
                "restore": restore_set(filesystem, f"{base}/state/{name}", held),
            }
            for name, held in sorted(partitions.items())
        },
    }


def restore_set(filesystem: pafs.FileSystem, folder: str, held: dict[str, int]) -> dict[str, Any]:
    """What a cold load of the partition's newest version fetches (``held``: its objects,
    relative to ``folder``, and their sizes)."""
    versions: dict[str, dict[int, str]] = {"zip": {}, "changelog": {}}
    for name in held:
        if match := _VERSIONED.match(name):
            versions[match[2]][int(match[1])] = name
    newest = max([*versions["zip"], *versions["changelog"]], default=0)
    snapshot = max(versions["zip"], default=None)
    found: dict[str, Any] = {"version": newest, "snapshot_version": snapshot}
    replay = [v for v in versions["changelog"] if (snapshot or 0) < v <= newest]
    objects = len(replay)
    size = sum(held[versions["changelog"][v]] for v in replay)
    if snapshot is not None:
        zip_name = versions["zip"][snapshot]
        objects += 1
        size += held[zip_name]
        try:
            ssts = _sst_files(filesystem, f"{folder}/{zip_name}")
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            found["snapshot_unreadable"] = f"{type(exc).__name__}: {exc}"
        else:
            on_store = {name.rsplit("/", 1)[-1]: s for name, s in held.items()}
            objects += len(ssts)
            size += sum(on_store.get(name, 0) for name in ssts)
            found["sst_files"] = len(ssts)
    found |= {"changelogs": len(replay), "objects": objects, "bytes": size}
    return found


def _sst_files(filesystem: pafs.FileSystem, path: str) -> list[str]:
    """The SST files a snapshot names (its ``metadata`` entry: a version line, then JSON)."""
    with filesystem.open_input_file(path) as source:
        data = source.read()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        text = archive.read("metadata").decode()
    payload = json.loads(text[text.index("{") :])
    return [str(f["dfsSstFileName"]) for f in payload.get("sstFiles", [])]
