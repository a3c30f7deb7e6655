"""The Airflow DAGs: they import cleanly, have the expected shape, and `airflow dags test`
runs the batch job for real (temporary AIRFLOW_HOME, SQLite, real Spark, real Delta)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lake.settings import LakeSettings
from tests.test_batch_job import archive, event

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    os.environ["AIRFLOW_HOME"] = str(home)  # for the in-process DagBag below
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    return env


def test_dag_folder_imports_cleanly_with_the_expected_dags(airflow_env: dict[str, str]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["ctr_batch", "ctr_maintenance"]

    batch = bag.dags.get("ctr_batch")
    assert batch is not None
    assert [t.task_id for t in batch.tasks] == ["recompute_ctr"]
    assert batch.catchup is True
    assert getattr(batch.timetable, "summary", None) == "0 * * * *"
    assert batch.max_active_runs == 1
    assert batch.default_args["retries"] == 2
    command = str(getattr(batch.get_task("recompute_ctr"), "bash_command", ""))
    assert "spark-submit" in command
    assert "SPARK_MASTER" in command

    maintenance = bag.dags.get("ctr_maintenance")
    assert maintenance is not None
    assert {t.task_id for t in maintenance.tasks} == {"prune_speed", "compact_and_vacuum"}
    assert str(maintenance.schedule) == "@daily"


def test_batch_schedule_and_lookback_come_from_the_environment(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `make demo` sets: a run every few minutes, each with a lookback of minutes.
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("CTR_BATCH_SCHEDULE", "*/5 * * * *")
    monkeypatch.setenv("CTR_BATCH_START_DATE", "2026-11-23T10:05Z")
    monkeypatch.setenv("CTR_BATCH_LOOKBACK_HOURS", "7")
    monkeypatch.setenv("CTR_BATCH_LOOKBACK_MINUTES", "15")  # takes precedence over hours
    bag = DagBag(dag_folder=str(ROOT / "dags" / "ctr_batch.py"))
    assert bag.import_errors == {}
    batch = bag.dags["ctr_batch"]
    assert getattr(batch.timetable, "summary", None) == "*/5 * * * *"
    assert batch.start_date == dt.datetime(2026, 11, 23, 10, 5, tzinfo=dt.UTC)
    task = batch.get_task("recompute_ctr")
    assert task.params["lookback_minutes"] == 15
    assert "macros.timedelta(minutes=params.lookback_minutes)" in str(
        getattr(task, "bash_command", "")
    )

    monkeypatch.delenv("CTR_BATCH_LOOKBACK_MINUTES")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "ctr_batch.py"))
    assert bag.dags["ctr_batch"].get_task("recompute_ctr").params["lookback_minutes"] == 7 * 60


@pytest.mark.timeout(600)
def test_airflow_dags_test_runs_the_batch_job(
    airflow_env: dict[str, str],
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    lake = LakeSettings(lake_root=tmp_path / "lake", checkpoint_root=tmp_path / "ck")
    t = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    archive(spark, lake, [
        event("in-lookback", "impression", t - dt.timedelta(minutes=90)),
        event("in-hour", "impression", t + dt.timedelta(minutes=30)),
        event("click", "click", t + dt.timedelta(minutes=30, seconds=5)),
        event("too-late", "impression", t + dt.timedelta(minutes=60)),
    ])  # fmt: skip
    env = {
        **airflow_env,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "SPARK_MASTER": "local[1]",
        "CTR_BATCH_LOOKBACK_HOURS": "2",
    }
    migrate = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True,
                             timeout=300, check=False)  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    # A manual run at 13:00 gets the data interval that ends then, [12:00, 13:00); with the
    # lookback it recomputes [10:00, 13:00).
    done = subprocess.run(
        [AIRFLOW, "dags", "test", "ctr_batch", "2026-11-22T13:00:00+00:00"],
        env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    rows = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table().to_pylist()
    assert sorted((r["bucket_start"], r["impressions"], r["clicks"]) for r in rows) == [
        (t - dt.timedelta(minutes=90), 1, 0),
        (t + dt.timedelta(minutes=30), 1, 1),
    ]
    [coverage] = DeltaTable(lake.table("batch/coverage")).to_pyarrow_table().to_pylist()
    assert (coverage["interval_start"], coverage["interval_end"]) == (
        t - dt.timedelta(hours=2), t + dt.timedelta(hours=1),
    )  # fmt: skip
    assert coverage["run_id"].startswith("ctr-")
