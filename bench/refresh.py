"""What keeping an API replica's lake snapshot current costs in object-store requests (issue 68).

The local S3 server (SeaweedFS, as `ctr s3 up` runs it) holds a lake with every served table;
writers commit as the jobs do — speed/ctr every second (the speed job), master/events and
master/arrivals every 10 s (the archiver), the batch tables not at all (no batch run in the
window) — straight to the server. The replica's snapshot source, with the API's settings
(``ApiSettings``: API_REFRESH_S, API_REFRESH_SELDOM_S, API_CACHE_STALE_S), reads through a
counting proxy in front of the server while a dashboard-like reader asks for the current snapshot
every 0.5 s (so the source keeps itself current, as it does while requests come). The proxy
counts every HTTP request the replica's process makes, delta-rs' included, by kind (LIST, GET,
HEAD, other); the figure is requests per second over the window, beside the source's own counts
when it keeps them.

``python -m bench refresh`` (``--seconds`` for the window, default 60). The same script run on an
older checkout gives the "before" figure (it uses only what SnapshotSource has always had).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pyarrow as pa
from deltalake import write_deltalake

from api.settings import ApiSettings
from infra.broker import free_port
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from lake.settings import LakeSettings
from lake.storage import delta_options
from runtime.object_store import ObjectStoreSettings
from serving_layer.snapshots import SCHEMAS, SnapshotSource

RESULTS: Final = Path("bench/results")
BUCKET: Final = "refresh"
# Who commits how often (seconds), as the jobs do; the other served tables keep still.
WRITERS: Final = {"speed/ctr": 1.0, "master/events": 10.0, "master/arrivals": 10.0}


class CountingProxy:
    """A TCP proxy to ``upstream`` on a free loopback port that counts the HTTP requests
    passing through it by kind (LIST, GET, HEAD, PUT, ...), reading each request's head and
    skipping its body by its Content-Length."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.counts: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="s3-proxy", daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close_connections(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _close_connections(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port)
        )
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _connection(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def requests() -> None:
            while True:
                head = await client_r.readuntil(b"\r\n\r\n")
                line, *headers = head.decode("latin-1").split("\r\n")
                method, target = line.split(" ")[:2]
                self.counts[_kind(method, target)] += 1
                server_w.write(head)
                length = next(
                    (
                        int(h.split(":", 1)[1])
                        for h in headers
                        if h.lower().startswith("content-length:")
                    ),
                    0,
                )
                while length > 0:
                    chunk = await client_r.read(min(length, 2**16))
                    if not chunk:
                        return
                    server_w.write(chunk)
                    length -= len(chunk)
                await server_w.drain()

        async def answers() -> None:
            while chunk := await server_r.read(2**16):
                client_w.write(chunk)
                await client_w.drain()

        with contextlib.suppress(Exception):
            await asyncio.gather(requests(), answers())
        for writer in (client_w, server_w):
            writer.close()


def _kind(method: str, target: str) -> str:
    if method == "GET" and ("list-type=" in target or target.rstrip("/").count("/") <= 1):
        return "LIST"
    return method


def main(events: int | None = None, seconds: float = 60.0) -> dict[str, object]:
    """``python -m bench refresh`` (``events`` is not this benchmark's measure: ignored)."""
    with tempfile.TemporaryDirectory(prefix="ctr-bench-refresh-") as scratch:
        work = Path(scratch)
        server = LocalS3(
            LocalS3Settings(run_dir=work / "s3run", port=free_base_port(), bucket=BUCKET)
        )
        server.start()
        try:
            return _run(server, seconds)
        finally:
            server.stop()


def _run(server: LocalS3, seconds: float) -> dict[str, object]:
    direct = _lake(server, server.settings.port, "lake")
    settings = ApiSettings(token="refresh-bench-token-0123456789")  # type: ignore[arg-type]
    print(f"bench refresh: a lake of {len(SCHEMAS)} served tables on the local S3 server")
    for name in SCHEMAS:
        _commit(direct, name)
    with CountingProxy(server.settings.port) as proxy:
        replica = _lake(server, proxy.port, "lake")
        source = _source(replica, settings)
        source.current()  # the cold start: every table read whole
        cold = dict(proxy.counts)
        proxy.counts.clear()
        before = Counter(getattr(source, "requests", {}))
        print(
            f"bench refresh: cold start {sum(cold.values())} requests {cold}; now {seconds:g} s "
            f"with speed/ctr committed every {WRITERS['speed/ctr']:g} s, master/events and "
            f"master/arrivals every {WRITERS['master/events']:g} s, a reader every 0.5 s",
            flush=True,
        )
        commits = _keep_committing(direct, seconds, lambda: source.cached() or source.current())
        counts = dict(proxy.counts)
    ours = {k: v - before.get(k, 0) for k, v in getattr(source, "requests", {}).items()}
    source.close()
    total = sum(counts.values())
    result: dict[str, object] = {
        "seconds": seconds,
        "settings": {
            "API_REFRESH_S": settings.refresh_s,
            "API_REFRESH_SELDOM_S": getattr(settings, "refresh_seldom_s", None),
            "API_CACHE_STALE_S": settings.cache_stale_s,
        },
        "commits": commits,
        "cold_start_requests": cold,
        "requests": counts,
        "requests_per_s": round(total / seconds, 2),
        "by_kind_per_s": {k: round(v / seconds, 2) for k, v in sorted(counts.items())},
        "source_counts": ours,
    }
    print(f"bench refresh: {total} requests in {seconds:g} s: {result['requests_per_s']}/s")
    print(f"bench refresh: by kind per second {result['by_kind_per_s']}")
    if ours:
        print(f"bench refresh: the source's own counts {ours}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "refresh.json").write_text(json.dumps(result, indent=2))
    return result


def _lake(server: LocalS3, port: int, prefix: str) -> LakeSettings:
    """The lake in the server's bucket, spoken to on ``port`` (the server's or the proxy's)."""
    env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in server.env_file.read_text().splitlines()
        if line.startswith("export ")
    )
    store = ObjectStoreSettings.model_validate(
        {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "CTR_S3_PATH_STYLE": True}
    )
    return LakeSettings.model_validate(
        {"LAKE_ROOT": f"s3://{BUCKET}/{prefix}", "object_store": store}
    )


def _source(lake: LakeSettings, settings: ApiSettings) -> SnapshotSource:
    """The API's snapshot source (only the arguments this checkout's SnapshotSource takes)."""
    wanted = {
        "refresh_s": settings.refresh_s,
        "seldom_s": getattr(settings, "refresh_seldom_s", None),
        "max_stale_s": settings.cache_stale_s,
    }
    accepted = inspect.signature(SnapshotSource).parameters
    return SnapshotSource(lake, **{k: v for k, v in wanted.items() if k in accepted})  # type: ignore[arg-type]


def _commit(lake: LakeSettings, name: str) -> None:
    """One row's append (empty for a table whose rows need more care: its first commit)."""
    schema = SCHEMAS[name]
    location = lake.table(name)
    table = pa.Table.from_pylist([], schema=schema)
    write_deltalake(
        location, table, mode="append", storage_options=delta_options(location, lake.object_store)
    )


def _keep_committing(
    lake: LakeSettings, seconds: float, read: Callable[[], object]
) -> dict[str, int]:
    commits: Counter[str] = Counter()
    start = time.monotonic()
    next_at = {name: start + every for name, every in WRITERS.items()}
    next_read = start
    while (now := time.monotonic()) < start + seconds:
        if now >= next_read:
            read()
            next_read += 0.5
        for name, at in next_at.items():
            if now >= at:
                _commit(lake, name)
                commits[name] += 1
                next_at[name] += WRITERS[name]
        time.sleep(0.02)
    return dict(commits)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.refresh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="the window measured")
    main(seconds=parser.parse_args(argv).seconds)


if __name__ == "__main__":
    cli()
