"""A private PostgreSQL for a test session or a benchmark: `infra/postgres.sh` run in a folder
of its own, on a free loopback port, stopped and removed afterwards."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from pydantic import SecretStr

from infra.broker import free_port
from infra.errors import InfraError

SCRIPT = Path(__file__).with_name("postgres.sh")


class PostgresUnavailableError(InfraError):
    """The private PostgreSQL did not start (no server binaries, no way to install them)."""


@contextlib.contextmanager
def private_postgres(environ: Mapping[str, str]) -> Iterator[SecretStr]:
    """A PostgreSQL cluster of its own, set up by `infra/postgres.sh` run with ``environ`` (the
    caller's environment: PATH; Airflow's settings are left out); yields the URL of its
    database `airflow` (postgresql://airflow:password@127.0.0.1:port/airflow), a secret. Its
    folder is under the system's temporary one, not pytest's: as root the server runs as the
    `postgres` OS user, which must reach it (pytest's parent folder is private to the user)."""
    run_dir = Path(tempfile.mkdtemp(prefix="ctr-pg-"))
    run_dir.chmod(0o755)
    env = {k: v for k, v in environ.items() if not k.startswith("AIRFLOW")}
    env.update(RUN_DIR=str(run_dir), PG_PORT=str(free_port()))
    try:
        # The first `up` on a machine may install Debian's postgresql.
        up = _script("up", env, timeout_s=300)
        if up.returncode != 0:
            raise PostgresUnavailableError(
                f"infra/postgres.sh up failed: {(up.stdout + up.stderr).strip()[-2000:]}"
            )
        yield SecretStr(_database_url(run_dir / "postgres" / "env"))
    finally:
        _script("down", env, timeout_s=120)
        shutil.rmtree(run_dir, ignore_errors=True)


def _database_url(env_file: Path) -> str:
    """The database URL `infra/postgres.sh` wrote for Airflow, in libpq's spelling."""
    for line in env_file.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        if name == "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
            return value.replace("postgresql+psycopg2://", "postgresql://", 1)
    raise PostgresUnavailableError(f"{env_file} names no database")


def _script(
    command: str, env: dict[str, str], *, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
