"""A SQL sandbox worker process:
``python -m serving_layer.sandbox.worker FD MEMORY_BYTES THREADS WORKDIR``.

Started by :class:`serving_layer.sandbox.pool.SqlPool` with one end of a socket pair as ``FD`` and
an empty private directory ``WORKDIR`` (the pool removes it once this process has ended). It
confines itself (see :func:`confine`), says ``"ready"``, then answers one request at a time
(``(sql, tables, access, max_rows, max_bytes, timeout_s, grace_s)`` → ``(kind, payload)``)
until the socket closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Final

from access.roles import Access
from runtime.object_store import ObjectStoreSettings
from serving_layer.sandbox.database import (
    SqlError,
    SqlRefusedError,
    check_read_only,
    execute,
    hidden_views,
    open_sandbox,
)
from serving_layer.snapshots import TableSnapshot

if TYPE_CHECKING:
    import duckdb

# Thread stacks, DuckDB's allocator arenas and Arrow buffers outside DuckDB's memory limit.
ADDRESS_SLACK: Final = 512 * 2**20
_M_ARENA_MAX: Final = -8


def main(argv: list[str]) -> None:
    fd, memory_bytes, threads = (int(a) for a in argv[:3])
    workdir = argv[3]
    conn = Connection(fd)
    try:
        confine(memory_bytes, workdir)
    except Exception as exc:
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    conn.send("ready")
    while True:
        try:
            request = conn.recv()
            sql, tables, store, access, max_rows, max_bytes, timeout_s, grace_s, params = request
        except (EOFError, OSError, KeyboardInterrupt):
            return
        _limit_cpu(timeout_s + grace_s, threads)
        conn.send(
            answer(
                sql,
                tables,
                store,
                access=access,
                max_rows=max_rows,
                max_bytes=max_bytes,
                timeout_s=timeout_s,
                memory_bytes=memory_bytes,
                threads=threads,
                params=params,
            )
        )
        _release_memory()


def answer(  # noqa: PLR0913 - keyword-only limits of one query
    sql: str,
    tables: Mapping[str, TableSnapshot],
    store: ObjectStoreSettings,
    *,
    max_rows: int,
    max_bytes: int,
    timeout_s: float,
    memory_bytes: int,
    threads: int,
    access: Access | None = None,
    params: Sequence[str | None] = (),
) -> tuple[str, object]:
    """One request's reply: ``("ok", SqlResult)`` or ``(kind, message)`` with kind one of
    refused, error, timeout, unavailable; over the tables and rows ``access`` may read, their
    files in ``store`` (the lake's, sent with the request: nothing read from the environment)."""
    try:
        statement = check_read_only(sql, access)
        con = _open(tables, store, memory_bytes, threads, access)
        try:
            result = execute(
                con,
                statement,
                max_rows=max_rows,
                max_bytes=max_bytes,
                timeout_s=timeout_s,
                params=params,
            )
        finally:
            con.close()
    except SqlError as exc:
        return _failure(_explained(exc, access))
    except Exception as exc:  # an Arrow error on a damaged file, say: an answer, not a crash
        return _failure(exc)
    return "ok", result


def _explained(exc: SqlError, access: Access | None) -> SqlError:
    """``exc``, saying so when the table it did not find is one ``access`` may not read."""
    for view in sorted(hidden_views(access)):
        if f"Table with name {view} does not exist" in str(exc):
            assert access is not None
            return SqlError(
                f"the table {view} is not readable with an {access.role} key "
                f"({access.name!r}); ask an admin for a key with access to it"
            )
    return exc


class _OpenFailedError(Exception):
    """The sandbox could not be opened: the reply's kind and message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _open(
    tables: Mapping[str, TableSnapshot],
    store: ObjectStoreSettings,
    memory_bytes: int,
    threads: int,
    access: Access | None,
) -> duckdb.DuckDBPyConnection:
    try:
        return open_sandbox(
            tables,
            store,
            memory_limit_bytes=memory_bytes,
            threads=threads,
            access=access,
        )
    except MemoryError:
        raise _OpenFailedError(
            "error", "the query ran out of memory (the sandbox's limit) while starting"
        ) from None
    except Exception as exc:
        raise _OpenFailedError(
            "unavailable", f"the lake snapshot could not be opened: {exc}"
        ) from None


def _failure(exc: Exception) -> tuple[str, str]:
    """The reply to a request that raised ``exc``."""
    if isinstance(exc, _OpenFailedError):
        return exc.kind, str(exc)
    if isinstance(exc, SqlRefusedError):
        return "refused", str(exc)
    if isinstance(exc, SqlError):
        # DuckDB's hints name settings the sandbox has locked.
        message = str(exc).split("\n\nPossible solutions")[0]
        return ("timeout" if "time limit" in message else "error"), message
    if isinstance(exc, MemoryError):
        return "error", "the query ran out of memory (the sandbox's limit)"
    return "error", f"{type(exc).__name__}: {exc}"


def confine(memory_bytes: int, workdir: str) -> None:
    """OS limits for this process: no file may grow, ``workdir`` (private, empty) as working
    directory, an address-space cap of what is mapped now plus ``memory_bytes``, niceness 10,
    no core."""
    os.environ.pop("API_TOKEN", None)
    os.nice(10)
    with contextlib.suppress(OSError, AttributeError):
        # Fewer glibc malloc arenas: each reserves 64 MiB of address space per thread.
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 2)
    import duckdb
    import pyarrow as pa

    # Arrow's default allocator reserves large address ranges up front; malloc does not.
    pa.set_memory_pool(pa.system_memory_pool())
    os.chdir(workdir)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    # Warm up: DuckDB's first connection maps its allocator and thread pool.
    warm = duckdb.connect(config={"enable_external_access": False, "threads": 1})
    warm.execute("SELECT 1").fetchall()
    warm.close()
    limit = _mapped_bytes() + memory_bytes + ADDRESS_SLACK
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _release_memory() -> None:
    """Give freed heap back to the system, so the next query has the whole address budget."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _limit_cpu(wall_s: float, threads: int) -> None:
    """CPU seconds for the next query: what it may use in ``wall_s`` on ``threads`` threads."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used.ru_utime + used.ru_stime + wall_s * threads) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _mapped_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover - Linux only


if __name__ == "__main__":
    main(sys.argv[1:])
