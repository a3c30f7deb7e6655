"""Sandboxed SQL in worker processes: bounded concurrency, OS limits, a kill at the time limit.

Each query runs in one of a few worker processes (:mod:`serving_layer.sandbox.worker`, fresh
interpreters), each confined at start:

- no file can grow (``RLIMIT_FSIZE`` 0) and its working directory is an empty private one,
  which the pool creates and removes once the process has ended (also after a kill);
- its address space is capped (``RLIMIT_AS``: what the worker mapped at start plus
  ``memory_bytes``), so a query that allocates too much fails with DuckDB's out-of-memory error
  (or the worker dies) instead of taking the server's memory;
- CPU time per query is capped (``RLIMIT_CPU``, raised before each query by what it may use);
- it runs niced, so the API's own requests win the CPU.

The parent waits ``timeout_s`` plus a grace period for an answer; DuckDB's own interrupt
stops most queries at ``timeout_s``, and a worker still busy after the grace period (a single
huge regular expression, say: DuckDB checks for interrupts between row batches only) is killed
and replaced. At most ``workers`` queries run at once and ``queue`` more wait; beyond that
:class:`SqlBusyError`.

Statements are checked (:func:`serving_layer.sandbox.check_read_only`: one read-only query,
allowed functions and the key's views only) before a worker sees them. A query that costs its
worker backs off the client that sent it (:mod:`serving_layer.sandbox.backoff`, timed by the
pool's ``clock``): its next queries get :class:`SqlBusyError` at once, without a worker, for a
pause that doubles with each strike.
The back-off may be kept outside the pool (``backoffs``: the API's limits store, where its
replicas share it); then the pool's own ``backoff`` and ``clock`` are not used.
A query stopped at the time limit is a strike; one that cost its worker process (killed at the
hard limit, crashed, out of memory: a new interpreter must start) two. A query that succeeds
ends nothing: strikes are forgiven one per ``forgive_s`` without a new one, so a cheap query
between two costly ones does not reset the pause. Other clients are not affected. The API
names a client by its key (:func:`api.deps.get_client`), and gives each key a share of the
workers (:class:`api.query_gate.QueryGate`) before a query reaches the pool.
"""

from __future__ import annotations

import contextlib
import math
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

from access.roles import Access
from runtime.object_store import ObjectStoreSettings
from serving_layer.errors import ServingError
from serving_layer.sandbox.backoff import (
    STOPPED_STRIKES,
    WORKER_LOST_STRIKES,
    BackoffBook,
    Backoffs,
    ClientBackoff,
)
from serving_layer.sandbox.database import (
    SqlError,
    SqlRefusedError,
    SqlResult,
    SqlTimeLimitError,
    check_read_only,
    sandbox_views,
)
from serving_layer.snapshots import LakeSnapshot, TableSnapshot

_START_TIMEOUT_S: Final = 60.0
_WORKDIR_PREFIX: Final = "ctr-sql-"
_SIGNALS: Final = {
    signal.SIGXCPU: "it used up its CPU time limit",
    signal.SIGKILL: "it was killed (out of memory?)",
    signal.SIGSEGV: "it crashed",
    signal.SIGABRT: "it aborted (out of memory?)",
    signal.SIGBUS: "it crashed",
}


class SqlBusyError(ServingError, RuntimeError):
    """Every worker is busy and the queue is full (or the wait for a worker timed out)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SandboxUnavailableError(ServingError, RuntimeError):
    """The sandbox could not be set up: a worker did not start, or the lake is unreadable."""


class _WorkerDiedError(SqlError):
    """The worker process ended while it ran the query (a crash, a kill from outside)."""


@dataclass(frozen=True)
class PoolStats:
    workers: int
    busy: int
    waiting: int
    queries: int
    refused: int
    failed: int
    timed_out: int
    rejected_busy: int
    backed_off: int
    worker_restarts: int


class SqlPool:
    """Runs sandboxed queries over lake snapshots in ``workers`` processes; thread-safe."""

    def __init__(  # noqa: PLR0913 - keyword-only settings, each with a default
        self,
        *,
        workers: int = 2,
        queue_size: int = 4,
        queue_timeout_s: float = 30.0,
        memory_bytes: int = 2**30,
        threads: int = 1,
        grace_s: float = 2.0,
        max_queries_per_worker: int = 500,
        backoff: ClientBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoffs: BackoffBook | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"'workers' must be >= 1, got {workers}")
        if queue_size < 0:
            raise ValueError(f"'queue_size' must be >= 0, got {queue_size}")
        if memory_bytes < 64 * 2**20:
            raise ValueError(f"'memory_bytes' must be at least 64 MiB, got {memory_bytes}")
        if threads < 1:
            raise ValueError(f"'threads' must be >= 1, got {threads}")
        self.workers = workers
        self.queue_size = queue_size
        self.queue_timeout_s = queue_timeout_s
        self.memory_bytes = memory_bytes
        self.threads = threads
        self.grace_s = grace_s
        self.max_queries_per_worker = max_queries_per_worker
        # The clients backed off: ``backoffs`` (kept for several processes, by its policy), else
        # this pool's own, timed by ``clock`` (tests pass one they move).
        self._backoffs: BackoffBook = backoffs or Backoffs(backoff or ClientBackoff(), clock)
        self.backoff = self._backoffs.policy
        self._all = [_Worker(memory_bytes, threads) for _ in range(workers)]
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        for worker in self._all:
            self._idle.put(worker)
        self._lock = threading.Lock()
        self._admitted = 0
        self._closed = False
        self._counts = dict.fromkeys(
            ("queries", "refused", "failed", "timed_out", "rejected_busy", "backed_off"), 0
        )

    def run(  # noqa: PLR0913 - keyword-only limits of one query
        self,
        sql: str,
        snapshot: LakeSnapshot,
        *,
        max_rows: int = 10_000,
        max_bytes: int = 16 * 2**20,
        timeout_s: float = 10.0,
        client: str | None = None,
        access: Access | None = None,
        params: Sequence[str | None] = (),
    ) -> SqlResult:
        """Run one read-only query over ``snapshot`` in a worker, over the tables and rows
        ``access`` may read (None: an admin's; see
        :func:`~serving_layer.sandbox.database.open_sandbox`). ``params`` are the values of
        its ``$1``, ``$2``… (text or NULL, cast by DuckDB to the type each place wants), never
        part of its text.

        ``client`` (the caller's address, say) is whom a query that costs its worker backs
        off; ``None``: nobody. Raises :class:`SqlRefusedError` (not a single read-only query,
        or a function not allowed), :class:`SqlError` (it failed or hit a limit),
        :class:`SqlBusyError` (no worker free in time, or ``client`` backed off) and
        :class:`SandboxUnavailableError` (the sandbox could not be set up).
        """
        if max_rows < 1:
            raise ValueError(f"'max_rows' must be >= 1, got {max_rows}")
        if max_bytes < 1:
            raise ValueError(f"'max_bytes' must be >= 1, got {max_bytes}")
        if timeout_s <= 0:
            raise ValueError(f"'timeout_s' must be > 0, got {timeout_s}")
        if any(p is not None and not isinstance(p, str) for p in params):
            raise ValueError("'params' must be strings or None")
        self.check_backoff(client)
        try:
            statement = check_read_only(sql, access)
        except SqlRefusedError:
            self._count("refused")
            raise
        # Only the tables it may read reach the worker.
        tables = {view: snapshot[name] for view, name in sandbox_views(access).items()}
        with self.admission():
            try:
                worker = self._idle.get(timeout=self.queue_timeout_s)
            except queue.Empty:
                self._count("rejected_busy")
                raise SqlBusyError(
                    f"no SQL worker became free within {self.queue_timeout_s:g} s; try again",
                    retry_after_s=max(1, round(timeout_s)),
                ) from None
            try:
                if self._closed:
                    raise SandboxUnavailableError("the SQL worker pool is closed")
                return self._run(
                    worker,
                    statement,
                    tables,
                    snapshot.store,
                    max_rows=max_rows,
                    max_bytes=max_bytes,
                    timeout_s=timeout_s,
                    client=client,
                    access=access,
                    params=tuple(params),
                )
            finally:
                self._idle.put(worker)

    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """A place among the running and waiting queries, or :class:`SqlBusyError` at once."""
        with self._lock:
            if self._admitted >= self.workers + self.queue_size:
                self._counts["rejected_busy"] += 1
                raise SqlBusyError(
                    f"too many SQL queries at once ({self.workers} running, "
                    f"{self.queue_size} waiting); try again shortly"
                )
            self._admitted += 1
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1

    def _run(  # noqa: PLR0913 - keyword-only limits of one query
        self,
        worker: _Worker,
        sql: str,
        tables: Mapping[str, TableSnapshot],
        store: ObjectStoreSettings,
        *,
        max_rows: int,
        max_bytes: int,
        timeout_s: float,
        client: str | None,
        access: Access | None,
        params: tuple[str | None, ...] = (),
    ) -> SqlResult:
        if worker.queries >= self.max_queries_per_worker:
            worker.stop()
        self._count("queries")
        try:
            limits = (max_rows, max_bytes, timeout_s, self.grace_s)
            kind, payload = worker.ask(
                (sql, dict(tables), store, access, *limits, params),
                wait_s=timeout_s + self.grace_s,
            )
        except TimeoutError:
            self._count("timed_out")
            raise SqlTimeLimitError(
                f"the query was stopped at the time limit of {timeout_s:g} s"
                + self._back_off(client, WORKER_LOST_STRIKES),
                self._retry_after(client),
            ) from None
        except _WorkerDiedError as exc:
            self._count("failed")
            raise SqlError(str(exc) + self._back_off(client, WORKER_LOST_STRIKES)) from None
        if kind == "ok":
            assert isinstance(payload, SqlResult)
            return payload
        message = str(payload)
        if kind == "refused":
            self._count("refused")
            raise SqlRefusedError(message)
        if kind == "unavailable":
            raise SandboxUnavailableError(message)
        if kind == "timeout":
            self._count("timed_out")
            message += self._back_off(client, STOPPED_STRIKES)
            raise SqlTimeLimitError(message, self._retry_after(client))
        else:
            self._count("failed")
        if "Out of Memory" in message:
            # Its address space may be fragmented now: the next query gets a fresh process.
            worker.stop()
            message += self._back_off(client, WORKER_LOST_STRIKES)
        raise SqlError(message)

    def check_backoff(self, client: str | None) -> None:
        """:class:`SqlBusyError` while ``client`` is backed off (None: never)."""
        wait_s = 0.0 if client is None else self._backoffs.wait_s(client)
        if wait_s <= 0:
            return
        self._count("backed_off")
        raise SqlBusyError(
            f"recent queries with this key cost SQL workers (stopped at the time limit, "
            f"crashed or ran out of memory): its queries are refused for {wait_s:.1f} s more "
            f"(the pause doubles with each such query, up to {self.backoff.max_s:g} s, and "
            f"shrinks by half for each {self.backoff.forgive_s:g} s without one)",
            retry_after_s=max(1, math.ceil(wait_s)),
        )

    def strikes(self, client: str) -> int:
        """The strikes ``client`` has now (0: not backed off)."""
        return self._backoffs.strikes(client)

    def _retry_after(self, client: str | None) -> float:
        """Seconds before ``client`` may ask again: its back-off's, at least one."""
        return max(1.0, 0.0 if client is None else self._backoffs.wait_s(client))

    def _back_off(self, client: str | None, strikes: int) -> str:
        """Back ``client`` off after its query cost ``strikes``; what to add to its error."""
        if client is None:
            return ""
        pause_s = self._backoffs.strike(client, strikes)
        return f"; this key's queries are refused for the next {pause_s:g} s"

    def stats(self) -> PoolStats:
        with self._lock:
            admitted = self._admitted
            counts = dict(self._counts)
        busy = self.workers - self._idle.qsize()
        return PoolStats(
            workers=self.workers,
            busy=busy,
            waiting=max(0, admitted - busy),
            worker_restarts=sum(max(w.restarts, 0) for w in self._all),
            **counts,
        )

    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (for tests and diagnostics)."""
        return [pid for w in self._all if (pid := w.pid) is not None]

    def query_pids(self) -> list[int]:
        """Process ids of the workers a query has been sent to and not yet answered from
        (for tests and diagnostics: ending one of these ends its query)."""
        return [pid for w in self._all if w.asked and (pid := w.pid) is not None]

    def close(self) -> None:
        self._closed = True
        for worker in self._all:
            worker.stop()

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1


class _Worker:
    """One worker process and its socket; used by one query at a time."""

    def __init__(self, memory_bytes: int, threads: int) -> None:
        self.memory_bytes = memory_bytes
        self.threads = threads
        self.queries = 0
        self.asked = False  # a query sent, its answer not yet received
        self.restarts = -1  # the first start is no restart
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._workdir: str | None = None

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def ask(self, request: tuple[Any, ...], *, wait_s: float) -> tuple[str, object]:
        """Send ``request`` and wait ``wait_s`` for the answer; past that the worker is killed
        and :class:`TimeoutError` raised; :class:`_WorkerDiedError` if it ended meanwhile."""
        conn = self._connection()
        self.queries += 1
        self.asked = True
        try:
            conn.send(request)
            answered = conn.poll(wait_s)
            if answered:
                reply: tuple[str, object] = conn.recv()
        except (EOFError, OSError):
            raise _WorkerDiedError(f"the query's worker process ended: {self._death()}") from None
        finally:
            self.asked = False
        if not answered:
            self.stop()
            raise TimeoutError
        return reply

    def _connection(self) -> Connection:
        if self._conn is not None and self._process is not None and self._process.poll() is None:
            return self._conn
        self.stop()
        # Made and removed here: a killed worker cannot clean up after itself.
        workdir = tempfile.mkdtemp(prefix=_WORKDIR_PREFIX)
        parent, child = socket.socketpair()
        try:
            # A fresh interpreter (not a fork of a threaded server, nor multiprocessing's
            # re-import of the caller's main module).
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "serving_layer.sandbox.worker",
                    str(child.fileno()),
                    str(self.memory_bytes),
                    str(self.threads),
                    workdir,
                ],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            parent.close()
            shutil.rmtree(workdir, ignore_errors=True)
            raise SandboxUnavailableError(f"a SQL worker process did not start: {exc}") from None
        finally:
            child.close()
        conn = Connection(parent.detach())
        self._process, self._conn, self._workdir = process, conn, workdir
        self.restarts += 1
        self.queries = 0
        try:
            if not conn.poll(_START_TIMEOUT_S):
                raise SandboxUnavailableError(
                    f"a SQL worker process did not start within {_START_TIMEOUT_S:g} s"
                )
            ready = conn.recv()
        except (EOFError, OSError):
            ready = self._death()
        if ready != "ready":
            self.stop()
            raise SandboxUnavailableError(f"a SQL worker process failed to start: {ready}")
        return conn

    def _death(self) -> str:
        process = self._process
        if process is None:
            return "it was not running"
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.stop()
        if code is not None and code < 0:
            signum = signal.Signals(-code)
            return f"{_SIGNALS.get(signum, 'it ended')} ({signum.name})"
        return f"it exited with code {code}"

    def stop(self) -> None:
        """End the process (killed if still running) and remove its working directory."""
        process, conn, workdir = self._process, self._conn, self._workdir
        self._process = self._conn = self._workdir = None
        if conn is not None:
            conn.close()
        if process is not None:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        if workdir is not None:
            # Empty unless the worker made directories (it cannot grow a file).
            shutil.rmtree(workdir, ignore_errors=True)
