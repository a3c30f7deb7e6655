"""Airflow on PostgreSQL with the LocalExecutor, for real: `infra/postgres.sh` starts a private
PostgreSQL (as the `postgres` OS user when run as root, as CI does), says so when it is up
already and keeps its data across down and up; `infra/airflow-up.sh` with AIRFLOW_DB=postgres
migrates Airflow's metadata database there, registers the project's DAGs without an import
error, and the scheduler's LocalExecutor runs `ctr_recompute_stale`'s check (no Spark: nothing
is stale in an empty lake), each state read back from PostgreSQL."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from infra.broker import free_port
from tests.support import ROOT
from tests.support.waiting import wait_until

POSTGRES = ROOT / "infra" / "postgres.sh"
DAG_IDS = ["ctr_batch", "ctr_maintenance", "ctr_recompute_stale", "ctr_reprocess"]


@dataclass(frozen=True)
class Cluster:
    run_dir: Path
    env: dict[str, str]  # for infra/*.sh: RUN_DIR, PG_PORT

    @property
    def dir(self) -> Path:
        return self.run_dir / "postgres"

    def settings(self) -> dict[str, str]:
        """What `source RUN_DIR/postgres/env` exports."""
        lines = (self.dir / "env").read_text().splitlines()
        exports = [line.removeprefix("export ") for line in lines if line.startswith("export ")]
        return {name: value for name, _, value in (line.partition("=") for line in exports)}

    def engine(self, password: str | None = None) -> sa.Engine:
        url = sa.make_url(self.settings()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        if password is not None:
            url = url.set(password=password)
        return sa.create_engine(url, poolclass=sa.NullPool)


def script(
    path: Path, *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def postgres() -> Iterator[Cluster]:
    # Not pytest's tmp_path: its parent is private to the user running the tests (mode 700), and
    # as root the server runs as the `postgres` OS user, which must reach its data directory.
    run_dir = Path(tempfile.mkdtemp(prefix="ctr-pg-"))
    run_dir.chmod(0o755)
    # Nothing of the shell's Airflow settings (AIRFLOW_HOME, a database URL, ...).
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(RUN_DIR=str(run_dir), PG_PORT=str(free_port()))
    try:
        up = script(POSTGRES, "up", env=env, timeout=300)  # may install Debian's postgresql
        assert up.returncode == 0, up.stdout + up.stderr
        yield Cluster(run_dir, env)
    finally:
        script(POSTGRES, "down", env=env)
        shutil.rmtree(run_dir, ignore_errors=True)


def test_up_is_idempotent_and_the_data_survives_down_and_up(postgres: Cluster) -> None:
    port = postgres.env["PG_PORT"]
    password = (postgres.dir / "password").read_text()
    for secret in ("password", "env"):
        assert (postgres.dir / secret).stat().st_mode & 0o777 == 0o600
    assert postgres.settings() == {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
            f"postgresql+psycopg2://airflow:{password}@127.0.0.1:{port}/airflow"
        ),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    }
    if os.geteuid() == 0:  # PostgreSQL refuses root: the cluster is the postgres user's
        assert (postgres.dir / "data").stat().st_uid == pwd.getpwnam("postgres").pw_uid

    again = script(POSTGRES, "up", env=postgres.env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"already running (pid {_pid(postgres)}) on 127.0.0.1:{port}" in again.stdout

    with postgres.engine().begin() as db:
        assert db.execute(sa.text("SHOW listen_addresses")).scalar() == "127.0.0.1"
        db.execute(sa.text("CREATE TABLE probe (note text)"))
        db.execute(sa.text("INSERT INTO probe VALUES ('written before down')"))
    with pytest.raises(OperationalError, match="password authentication failed"):
        postgres.engine(password="not-" + password).connect()

    down = script(POSTGRES, "down", env=postgres.env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped" in down.stdout
    status = script(POSTGRES, "status", env=postgres.env)
    assert (status.returncode, status.stdout.split(" (")[0]) == (3, "postgres: not running")
    up = script(POSTGRES, "up", env=postgres.env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "started" in up.stdout
    assert "creating the cluster" not in up.stdout

    assert (postgres.dir / "password").read_text() == password
    with postgres.engine().connect() as db:
        assert db.execute(sa.text("SELECT note FROM probe")).scalars().all() == [
            "written before down"
        ]


@pytest.mark.timeout(420)
def test_airflow_runs_on_postgres_with_the_local_executor(
    postgres: Cluster, tmp_path: Path
) -> None:
    env = {
        **postgres.env,
        "AIRFLOW_DB": "postgres",
        "AIRFLOW_PORT": str(free_port()),
        # Scheduled as soon as it is unpaused (its latest 10-minute interval); the DAGs that
        # would start Spark stay paused.
        "AIRFLOW_UNPAUSE": "ctr_recompute_stale",
        "AIRFLOW_START_TIMEOUT": "240",
        "LAKE_ROOT": str(tmp_path / "lake"),
        "CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "SPARK_MASTER": "spark://127.0.0.1:7077",  # a standalone master, through spark_default
    }
    up = script(ROOT / "infra" / "airflow-up.sh", env=env, timeout=360)
    try:
        log = _read(postgres.run_dir / "airflow.log")
        migrate = _read(postgres.run_dir / "airflow-migrate.log")
        assert up.returncode == 0, up.stdout + up.stderr + migrate[-3000:] + log[-5000:]
        port = postgres.env["PG_PORT"]
        using = (
            f"airflow: database postgresql+psycopg2://airflow:***@127.0.0.1:{port}/airflow, "
            "executor LocalExecutor"
        )
        assert using in up.stdout
        assert log.startswith(using)
        password = (postgres.dir / "password").read_text()
        assert password not in up.stdout + up.stderr + log
        # No SQLite database next to Airflow's home.
        assert not (postgres.run_dir / "airflow" / "airflow.db").exists()

        components = _environ(int((postgres.run_dir / "airflow.pid").read_text()))
        assert components["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert json.loads(components["AIRFLOW_CONN_SPARK_DEFAULT"]) == {
            "conn_type": "spark",
            "host": "spark://127.0.0.1:7077",
        }
        assert _spark_master(components) == "spark://127.0.0.1:7077"

        with postgres.engine().connect() as db:
            dags = db.execute(sa.text("SELECT dag_id FROM dag WHERE NOT is_stale ORDER BY 1"))
            assert dags.scalars().all() == DAG_IDS
            assert db.execute(sa.text("SELECT count(*) FROM import_error")).scalar() == 0
        run_id, state = _finished_run(postgres, "ctr_recompute_stale", timeout=240)
        with postgres.engine().connect() as db:
            # That run's tasks only: the next 10-minute interval may have started its own run.
            tasks = db.execute(
                sa.text(
                    "SELECT task_id, state FROM task_instance"
                    " WHERE dag_id = 'ctr_recompute_stale' AND run_id = :run"
                ),
                {"run": run_id},
            )
            assert (state, {task: task_state for task, task_state in tasks}) == (
                "success",
                {"anything_stale": "success", "recompute_stale": "skipped"},
            )
        log = _read(postgres.run_dir / "airflow.log")
        assert "Loaded executor: :LocalExecutor:" in log
    finally:
        script(ROOT / "infra" / "airflow-down.sh", env=env)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _pid(cluster: Cluster) -> int:
    return int((cluster.dir / "data" / "postmaster.pid").read_text().split()[0])


def _environ(pid: int) -> dict[str, str]:
    """The environment of process ``pid`` (Airflow's component loop)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return {name: value for name, _, value in (entry.partition("=") for entry in entries)}


def _spark_master(env: dict[str, str]) -> str:
    """The master the Spark provider's spark-submit gets from the ``spark_default`` connection in
    ``env`` (in a subprocess: Airflow imported here would configure this session's logging)."""
    code = (
        "from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
        "command = SparkSubmitHook(conn_id='spark_default')._build_spark_submit_command('app.py')\n"
        "print('master:', command[command.index('--master') + 1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [master] = [line for line in done.stdout.splitlines() if line.startswith("master: ")]
    return master.removeprefix("master: ")


def _finished_run(cluster: Cluster, dag_id: str, *, timeout: float) -> tuple[str, str]:
    """The run id and state of ``dag_id``'s first run once it is done (waiting ``timeout`` s)."""
    query = sa.text("SELECT run_id, state FROM dag_run WHERE dag_id = :dag ORDER BY id LIMIT 1")

    def finished() -> tuple[str, str] | None:
        with cluster.engine().connect() as db:
            row = db.execute(query, {"dag": dag_id}).first()
        if row is None or row.state not in ("success", "failed"):
            return None
        return str(row.run_id), str(row.state)

    return wait_until(finished, timeout_s=timeout, what=f"{dag_id}'s first run finished", poll_s=2)
