"""API replicas on this machine: ``ctr serve`` processes over one lake, each on a port of its
own, for a load balancer (:mod:`infra.balancer`) to spread requests over (the replicas test,
``python -m bench replicas``).

Each replica is a process of its own, as on hosts of their own: it shares with the others only
what its environment names (the lake), never a file of theirs. Its output goes to
``run_dir/<name>.log``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from infra.balancer import Replica
from infra.broker import free_port
from infra.errors import InfraError


class ReplicaError(InfraError, RuntimeError):
    """A replica did not start."""


class ApiReplicas:
    """``count`` replicas named ``api-1`` … ``api-<count>`` with ``environ`` (the lake's and
    the API's settings; ``API_HOST`` and ``API_PORT`` are each replica's): :meth:`start`,
    :meth:`stop` (one or all), or a ``with`` block."""

    def __init__(
        self, count: int, environ: Mapping[str, str], run_dir: Path, *, host: str = "127.0.0.1"
    ) -> None:
        if count < 1:
            raise ValueError(f"'count' must be >= 1, got {count}")
        self.environ = dict(environ)
        self.run_dir = run_dir.absolute()
        self.host = host
        self.replicas = tuple(Replica(f"api-{n}", host, free_port()) for n in range(1, count + 1))
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    def url(self, name: str) -> str:
        replica = self._replica(name)
        return f"http://{replica.host}:{replica.port}"

    def pid(self, name: str) -> int:
        return self._processes[name].pid

    def start(self, *, timeout_s: float = 120.0) -> None:
        """Start every replica, then wait until each answers ``/healthz``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for replica in self.replicas:
            environ = {
                **self.environ,
                "API_HOST": replica.host,
                "API_PORT": str(replica.port),
            }
            with (self.run_dir / f"{replica.name}.log").open("ab") as log:
                self._processes[replica.name] = subprocess.Popen(
                    [sys.executable, "-c", "from cli.main import main; main()", "serve"],
                    env=environ, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        for replica in self.replicas:
            while not self._answers(replica):
                process = self._processes[replica.name]
                if process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise ReplicaError(
                        f"replica {replica.name} did not answer /healthz within {timeout_s:g} s "
                        f"(exit status {process.returncode}): see "
                        f"{self.run_dir / replica.name}.log"
                    )
                time.sleep(0.1)

    def stop(self, name: str | None = None, *, timeout_s: float = 30.0) -> None:
        """Stop replica ``name`` (default: all) with SIGTERM: it finishes the requests it has,
        then exits (SIGKILL after ``timeout_s``)."""
        names = [name] if name is not None else list(self._processes)
        for each in names:
            process = self._processes.get(each)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for each in names:
            process = self._processes.pop(each, None)
            if process is None:
                continue
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill(self, name: str) -> None:
        """SIGKILL replica ``name``, as if its host were lost: its requests in flight fail."""
        process = self._processes.pop(name)
        process.kill()
        process.wait()

    def _replica(self, name: str) -> Replica:
        for replica in self.replicas:
            if replica.name == name:
                return replica
        raise ValueError(f"no replica is named {name!r}")

    @staticmethod
    def _answers(replica: Replica) -> bool:
        url = f"http://{replica.host}:{replica.port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
