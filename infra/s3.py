"""An S3-compatible object store on this machine: SeaweedFS (``weed server``: master, volume
server, filer and S3 gateway in one process), its state under ``RUN_DIR/s3``.

``RUN_DIR/s3/data`` holds the objects (durable: they survive ``stop``), ``credentials.json`` the
access key made at the first start (mode 600), ``env`` the variables every component reads
(``source RUN_DIR/s3/env``). The server listens on 127.0.0.1 only; anonymous requests are
refused. Why SeaweedFS: docs/guides/object-storage.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.errors import InfraError
from infra.ports import LOWEST, bindable, claim, ephemeral_low

ROOT: Final = Path(__file__).resolve().parents[1]
BUILD_SCRIPT: Final = ROOT / "infra" / "seaweedfs.sh"
REGION: Final = "us-east-1"


class S3Error(InfraError, RuntimeError):
    """The local object store could not be started or stopped."""


class LocalS3Settings(BaseSettings):
    """``RUN_DIR`` (state), ``CTR_S3_PORT`` (the S3 endpoint; the server's other parts take the
    three ports after it), ``CTR_S3_BUCKET`` (created at start), ``CTR_S3_BINARY`` (a ``weed``
    of your own instead of the one ``make setup`` builds)."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    # The run directory whose s3/ folder holds the local server's state: the objects,
    # credentials.json, the env file, its log and pid file. Default: the project's run/.
    run_dir: Path = Field(default=ROOT / "run", validation_alias="RUN_DIR")
    # The local server's S3 port (on 127.0.0.1); its master, volume server and filer take the
    # three ports after it, and each of the four a gRPC port 10000 higher.
    port: int = Field(default=8333, ge=1024, le=65000, validation_alias="CTR_S3_PORT")
    # The bucket `ctr s3 up` creates at start and names in the env file it writes.
    bucket: str = Field(
        default="ctr-lake",
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        validation_alias="CTR_S3_BUCKET",
    )
    # A SeaweedFS `weed` executable of your own. Unset: the one infra/seaweedfs.sh builds from
    # source at the first start (then cached).
    binary: Path | None = Field(default=None, validation_alias="CTR_S3_BINARY")

    @property
    def s3_dir(self) -> Path:
        return self.run_dir.absolute() / "s3"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str


class LocalS3:
    """Start, stop and describe the local server of ``settings``."""

    def __init__(self, settings: LocalS3Settings) -> None:
        self.settings = settings
        self.dir = self.settings.s3_dir
        self.pid_file = self.dir / "weed.pid"
        self.log_file = self.dir / "weed.log"
        self.env_file = self.dir / "env"
        # The server this object started (reaped by stop); a `ctr s3 up` leaves it running.
        self._process: subprocess.Popen[bytes] | None = None

    def pid(self) -> int | None:
        """The server's pid while it runs."""
        try:
            pid = int(self.pid_file.read_text())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        return pid

    def ports(self) -> list[int]:
        """Every port the server listens on: S3, master, volume server, filer, and their gRPC
        ports 10000 higher."""
        base = self.settings.port
        return [base + i for i in range(4)] + [base + 10000 + i for i in range(4)]

    def credentials(self) -> S3Credentials:
        """The access key of this store, made at the first start."""
        path = self.dir / "credentials.json"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            made = {"access_key_id": "ctr", "secret_access_key": secrets.token_urlsafe(30)}
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                json.dump(made, out)
        return S3Credentials(**json.loads(path.read_text()))

    def environment(self) -> dict[str, str]:
        """The variables a component needs to use the store (what ``env`` exports)."""
        key = self.credentials()
        return {
            "AWS_ENDPOINT_URL": self.settings.endpoint,
            "AWS_ACCESS_KEY_ID": key.access_key_id,
            "AWS_SECRET_ACCESS_KEY": key.secret_access_key,
            "AWS_REGION": REGION,
            "CTR_S3_BUCKET": self.settings.bucket,
        }

    def start(self, *, timeout_s: float = 90.0) -> bool:
        """Start the server (False: it was running already), wait until it answers, create the
        bucket and write ``env``."""
        if self.pid() is not None:
            self._write_env()
            return False
        for port in self.ports():
            if not bindable(port):
                raise S3Error(
                    f"port {port} (of the S3 server's {', '.join(map(str, self.ports()))}) is "
                    "taken by another process: set CTR_S3_PORT or stop it"
                )
        binary = self._binary()
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        key = self.credentials()
        config = self.dir / "identities.json"
        identity = {
            "name": "ctr",
            "credentials": [{"accessKey": key.access_key_id, "secretKey": key.secret_access_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        descriptor = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump({"identities": [identity]}, out)
        port = self.settings.port
        command = [
            str(binary), "server",
            f"-dir={self.dir / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={port + 1}", f"-master.port.grpc={port + 10001}",
            f"-volume.port={port + 2}", f"-volume.port.grpc={port + 10002}",
            "-filer", f"-filer.port={port + 3}", f"-filer.port.grpc={port + 10003}",
            "-s3", f"-s3.port={port}", f"-s3.port.grpc={port + 10000}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={config}",
            "-master.volumeSizeLimitMB=256", "-volume.max=0",
            # No master to tell before the volume server stops (10 s by default): it is the
            # same process's. A stop still takes ~15 s: the filer's last metadata-log flush
            # waits for a volume that stopped first, then gives up.
            "-volume.preStopSeconds=0",
        ]  # fmt: skip
        with self.log_file.open("ab") as log:  # the server keeps its own descriptor
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir,
            )  # fmt: skip
        self._process = process
        self.pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise S3Error(f"the S3 server exited ({process.returncode}): see {self.log_file}")
            try:
                self._create_bucket()
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise S3Error(
                        f"the S3 server did not answer within {timeout_s:.0f} s ({exc}): see "
                        f"{self.log_file}"
                    ) from exc
                time.sleep(0.5)
        self._write_env()
        return True

    def stop(self, *, timeout_s: float = 30.0, discard: bool = False) -> bool:
        """Stop the server (False: it was not running). The data stays, unless ``discard`` (a
        scratch server's, a test's): then the server is killed at once, nothing it would
        flush being kept (a stop that keeps the data takes ~15 s: see :meth:`start`), and its
        data directory removed."""
        pid = self.pid()
        if pid is None:
            return False
        os.killpg(pid, signal.SIGKILL if discard else signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            _reap(pid)
            time.sleep(0.2)
        else:
            os.killpg(pid, signal.SIGKILL)
            _reap(pid)
        if self._process is not None:
            self._process.wait(timeout=5)
            self._process = None
        self.pid_file.unlink(missing_ok=True)
        if discard:
            shutil.rmtree(self.dir / "data", ignore_errors=True)
        return True

    def _binary(self) -> Path:
        if self.settings.binary is not None:
            if not os.access(self.settings.binary, os.X_OK):
                raise S3Error(f"CTR_S3_BINARY={self.settings.binary} is not an executable")
            return self.settings.binary
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise S3Error(f"no S3 server binary: {result.stderr.strip()}")
        return Path(result.stdout.strip().splitlines()[-1])

    def _create_bucket(self) -> None:
        import pyarrow.fs as pafs

        key = self.credentials()
        filesystem = pafs.S3FileSystem(
            access_key=key.access_key_id,
            secret_key=key.secret_access_key,
            region=REGION,
            endpoint_override=f"127.0.0.1:{self.settings.port}",
            scheme="http",
            allow_bucket_creation=True,
            connect_timeout=2,
            request_timeout=5,
        )
        info = filesystem.get_file_info(self.settings.bucket)
        if info.type == pafs.FileType.NotFound:
            filesystem.create_dir(self.settings.bucket)

    def _write_env(self) -> None:
        lines = [f"export {name}={value}" for name, value in self.environment().items()]
        descriptor = os.open(self.env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write("# The local S3 server (ctr s3 up): source this file.\n")
            out.write("\n".join(lines) + "\n")


def free_base_port() -> int:
    """A ``CTR_S3_PORT`` whose eight ports (:meth:`LocalS3.ports`) are all free now (tests,
    benchmarks): below the kernel's ephemeral range and checked by binding, as
    :func:`infra.ports.free_port` chooses its ports (and never one of those)."""
    top = min(ephemeral_low(), 65536) - 10004  # the block's gRPC ports stay below the range
    if top <= LOWEST:
        raise S3Error(f"no room for the S3 server's ports below the ephemeral range (from {top})")
    chooser = random.SystemRandom()
    for _ in range(200):
        base = chooser.randrange(max(LOWEST, top // 2), top)
        if claim([base + i for i in range(4)] + [base + 10000 + i for i in range(4)]):
            return base
    raise S3Error("no free block of ports for the S3 server")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
