"""The lake and the run directory are closed to other local users (issue 55: they were 644/755,
so any local account read raw events past every API scope), and Airflow's own configuration
binds to loopback. Read as another user where the tests run as root (``setpriv`` to nobody);
by the permission bits otherwise."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyspark.sql import SparkSession

from infra.airflow_config import on_loopback
from lake.settings import LakeSettings
from runtime.private import owner_only, umask_setting
from runtime.spark_settings import SparkSettings
from tests.support.lakes import new_lake

CTR = str(Path(sys.executable).with_name("ctr"))
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
NOBODY = 65534


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may enter (pytest's own temporary folders are owner-only, which
    would hide what this tests)."""
    path = Path(tempfile.mkdtemp(prefix="ctr-private-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def readable_by_others(root: Path) -> list[str]:
    """The files under ``root`` another local user can read."""
    files = [str(p) for p in sorted(root.rglob("*")) if p.is_file()]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        script = 'for f; do cat "$f" > /dev/null 2>&1 && echo "$f"; done; true'
        as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        found = subprocess.run(
            [*as_nobody, "--", "sh", "-c", script, "_", *files],
            capture_output=True,
            text=True,
            check=True,
        )
        return found.stdout.split()

    def open_to_others(path: Path) -> bool:
        chain = [path, *path.parents]
        return bool(path.stat().st_mode & stat.S_IROTH) and all(
            p.stat().st_mode & stat.S_IXOTH for p in chain[1:]
        )

    return [f for f in files if open_to_others(Path(f))]


def env(lake: LakeSettings, run_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "RUN_DIR": str(run_dir),
    }


def test_the_check_sees_a_readable_file(open_dir: Path) -> None:
    """The premise: a file made with the usual umask (022) in an open folder is read."""
    old = os.umask(0o022)
    try:
        (open_dir / "lake").mkdir()
        (open_dir / "lake" / "events.parquet").write_bytes(b"PAR1")
    finally:
        os.umask(old)
    assert readable_by_others(open_dir) == [str(open_dir / "lake" / "events.parquet")]


def test_the_cli_closes_the_lake_and_the_run_directory(open_dir: Path) -> None:
    lake = new_lake(open_dir)
    run_dir = open_dir / "run"
    old = os.umask(0o022)
    try:  # as an earlier version left them: open folders, readable files
        for folder in (Path(str(lake.lake_root)), Path(str(lake.checkpoint_root)), run_dir):
            folder.mkdir(mode=0o755)
        (run_dir / "api-token").write_text("secret")
        (run_dir / "kafka" / "ad-events-0").mkdir(parents=True)
        (run_dir / "kafka" / "ad-events-0" / "00000000000000000000.log").write_text("events")
        (run_dir / "postgres").mkdir()  # infra/postgres.sh's: its user passes through
    finally:
        os.umask(old)
    created = subprocess.run(
        [CTR, "keys", "create", "bi", "--scope", "analyst"],
        env=env(lake, run_dir),
        capture_output=True,
        text=True,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    for root in (Path(str(lake.lake_root)), Path(str(lake.checkpoint_root)), run_dir / "kafka"):
        assert stat.S_IMODE(root.stat().st_mode) == 0o700, root
    # Not listed by others, passed through: to the private PostgreSQL's folder (its own to set).
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o711
    assert stat.S_IMODE((run_dir / "postgres").stat().st_mode) == 0o755
    new = [p for p in Path(str(lake.lake_root)).rglob("*")]
    assert new  # the key store's table
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in new)
    assert readable_by_others(open_dir) == []


def test_spark_writes_owner_only_files(spark: SparkSession, open_dir: Path) -> None:
    """Hadoop sets the modes of what Spark's tasks write (the archiver's data files,
    checkpoints) from fs.permissions.umask-mode, not from the process's umask: the session's
    setting (runtime.spark) closes them even from a process whose umask is 022, as this one's."""
    assert spark.conf.get("spark.hadoop.fs.permissions.umask-mode") == "077"
    target = open_dir / "written"
    old = os.umask(0o022)
    try:
        spark.range(10).write.parquet(str(target))
    finally:
        os.umask(old)
    written = [p for p in target.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written)
    assert [str(p) for p in written if stat.S_IMODE(p.stat().st_mode) & 0o077] == []
    assert readable_by_others(open_dir) == []


def test_airflows_own_configuration_binds_loopback(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    home.mkdir(mode=0o755)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    environment["AIRFLOW_HOME"] = str(home)

    def host(section: str, option: str) -> str:
        got = subprocess.run(
            [AIRFLOW, "config", "get-value", section, option],
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        )
        return got.stdout.strip()

    assert host("api", "host") == "0.0.0.0"  # what Airflow writes: all interfaces
    subprocess.run([sys.executable, "-m", "infra.airflow_config", str(home)], check=True)
    assert host("api", "host") == "127.0.0.1"
    assert host("scheduler", "scheduler_health_check_server_host") == "127.0.0.1"
    assert host("celery", "flower_host") == "127.0.0.1"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "airflow.cfg").stat().st_mode) == 0o600


def test_settings_missing_from_a_file_are_added_to_their_section() -> None:
    text = "[core]\nx = 1\n\n[api]\n# host = 0.0.0.0\nport = 8080\n"
    assert on_loopback(text) == (
        "[core]\nx = 1\n\n[api]\n# host = 0.0.0.0\nport = 8080\nhost = 127.0.0.1\n"
        "\n[celery]\nflower_host = 127.0.0.1\n"
        "\n[scheduler]\nscheduler_health_check_server_host = 127.0.0.1\n"
    )


def test_the_umask_setting(monkeypatch: pytest.MonkeyPatch, open_dir: Path) -> None:
    assert umask_setting({}) == 0o077
    assert umask_setting({"CTR_UMASK": "027"}) == 0o027
    with pytest.raises(ValueError, match="CTR_UMASK must be an octal umask like 077, got '9'"):
        umask_setting({"CTR_UMASK": "9"})
    monkeypatch.setenv("CTR_UMASK", "027")
    assert SparkSettings().umask == 0o027  # what Spark's Hadoop files get (runtime.spark)
    monkeypatch.setenv("CTR_UMASK", "9")
    with pytest.raises(ValidationError, match="CTR_UMASK must be an octal umask like 077, got '9'"):
        SparkSettings()
    old = os.umask(0o022)
    try:
        owner_only([open_dir, None, "s3://bucket/lake", open_dir / "missing"], 0o027)
        assert stat.S_IMODE(open_dir.stat().st_mode) == 0o750
    finally:
        os.umask(old)
