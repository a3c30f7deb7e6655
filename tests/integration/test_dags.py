"""The Airflow DAGs: they import cleanly, have the expected shape, parse the same whatever the
environment, and `airflow dags test` runs the batch job for real through the Spark provider's
SparkSubmitOperator (temporary AIRFLOW_HOME, SQLite, a `spark_default` connection from the
environment, real Spark, real Delta)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lake.catalog import MASTER_EVENTS
from tests.support import ROOT
from tests.support.events import archive, event
from tests.support.lakes import new_lake
from tests.support.python_archives import manifest_archive, manifest_of_this_checkout

DAGS = ROOT / "dags"
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
# What the DAGs read from the environment at parse time before issue 17, and what the tasks read
# when they run; none of it may change a parsed DAG.
GARBAGE = {
    "CTR_BATCH_SCHEDULE": "not a cron",
    "CTR_BATCH_START_DATE": "yesterday",
    "CTR_BATCH_LOOKBACK_HOURS": "many",
    "CTR_BATCH_LOOKBACK_MINUTES": "-1",
    "CTR_MAINTENANCE_SCHEDULE": "never",
    "SPARK_MASTER": "nowhere",
    "SPARK_CONF": "{not json",
    "LAKE_ROOT": "/nonexistent/lake",
    "CHECKPOINT_ROOT": "/nonexistent/checkpoints",
    "CTR_JAR_CACHE": "/nonexistent/jars",
}


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A scratch AIRFLOW_HOME, set in this process (for the in-process DagBag) until the
    module's tests are done, and the environment for `airflow` subprocesses."""
    home = tmp_path_factory.mktemp("airflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_HOME", str(home))
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        yield {
            **os.environ,
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        }


@pytest.fixture(scope="module")
def migrated(airflow_env: dict[str, str]) -> dict[str, str]:
    """The environment of the `airflow dags test` runs (none of GARBAGE), its AIRFLOW_HOME's
    database made once for the module's runs (`airflow db migrate`, no need for one per test)."""
    env = {k: v for k, v in airflow_env.items() if k not in GARBAGE}
    migrate = airflow("db migrate", env=env, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    return env


def dag_bag(patch: pytest.MonkeyPatch) -> Any:
    """The DAG folder parsed afresh: the helper module too, not a copy cached in sys.modules."""
    from airflow.dag_processing.dagbag import DagBag

    for name in [m for m in sys.modules if m == "dags" or m.startswith("dags.")]:
        patch.delitem(sys.modules, name)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    return bag


def serialized(bag: Any) -> dict[str, Any]:
    from airflow.serialization.serialized_objects import DagSerialization

    return {dag_id: DagSerialization.to_dict(dag) for dag_id, dag in sorted(bag.dags.items())}


def airflow(
    command: str, *args: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``airflow <command> <args>`` in a subprocess, its output captured."""
    return subprocess.run(
        [AIRFLOW, *command.split(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dag_folder_imports_cleanly_with_the_expected_dags(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    bag = dag_bag(monkeypatch)
    assert sorted(bag.dag_ids) == [
        "ctr_batch",
        "ctr_maintenance",
        "ctr_recompute_stale",
        "ctr_reprocess",
    ]

    batch = bag.dags["ctr_batch"]
    assert [t.task_id for t in batch.tasks] == ["recompute_ctr"]
    assert getattr(batch.timetable, "summary", None) == "0 * * * *"
    assert batch.catchup is False
    assert batch.max_active_runs == 1
    assert batch.default_args["retries"] == 2
    assert batch.params["lookback_minutes"] == 120
    assert batch.params["preview"] is False
    submit = batch.get_task("recompute_ctr")
    assert isinstance(submit, SparkSubmitOperator)
    assert submit.application == str(ROOT / "cli" / "submit.py")
    assert "params.lookback_minutes" in " ".join(submit.application_args or [])
    assert "params.preview" in " ".join(submit.application_args or [])
    assert {a.name for a in submit.outlets} == {"batch/ctr", "batch/coverage"}
    assert submit.env_vars is not None
    assert submit.env_vars["PYSPARK_PYTHON"] == sys.executable

    stale = bag.dags["ctr_recompute_stale"]
    assert [t.task_id for t in stale.tasks] == ["anything_stale", "recompute_stale"]
    assert getattr(stale.timetable, "summary", None) == "*/10 * * * *"
    assert stale.max_active_runs == 1
    recompute = stale.get_task("recompute_stale")
    assert isinstance(recompute, SparkSubmitOperator)
    assert recompute.application_args == ["--stale"]
    assert recompute.upstream_task_ids == {"anything_stale"}

    reprocess = bag.dags["ctr_reprocess"]
    assert [t.task_id for t in reprocess.tasks] == ["build", "review", "publish"]
    assert reprocess.schedule is None
    assert set(reprocess.params) == {"view", "version", "source", "max_changed_fraction"}
    assert reprocess.get_task("build").application_args[:2] == ["--build", "{{ params.view }}"]
    # Built from master/events or from a replay of the topic, as `ctr views build --from`.
    assert reprocess.get_task("build").application_args[-2:] == ["--from", "{{ params.source }}"]
    assert reprocess.params.get_param("source").schema["enum"] == ["master", "kafka"]

    maintenance = bag.dags["ctr_maintenance"]
    assert {t.task_id for t in maintenance.tasks} == {"compact_and_vacuum"}
    assert str(maintenance.schedule) == "@daily"


def test_parsing_reads_no_environment(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in GARBAGE:
        monkeypatch.delenv(name, raising=False)
    clean = serialized(dag_bag(monkeypatch))
    for name, value in GARBAGE.items():
        monkeypatch.setenv(name, value)
    assert serialized(dag_bag(monkeypatch)) == clean


def test_on_a_cluster_the_dags_spark_submit_ships_the_packed_environment(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every Spark task's command line, as the Spark provider builds it on the worker, carries
    the project's packed environment for the executors when the connection names a cluster,
    and nothing of it on local[N]."""
    archive = manifest_archive(tmp_path / "ctr-lambda-python.tar.gz", manifest_of_this_checkout())
    monkeypatch.setenv("SPARK_PYTHON_ARCHIVE", str(archive))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    bag = dag_bag(monkeypatch)
    tasks = [("ctr_batch", "recompute_ctr"), ("ctr_recompute_stale", "recompute_stale")]
    tasks.append(("ctr_reprocess", "build"))
    for master, ships in [("spark://10.1.2.3:7077", True), ("local[2]", False)]:
        connection = {"conn_type": "spark", "host": master}
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))
        for dag_id, task_id in tasks:
            task = copy.deepcopy(bag.dags[dag_id].get_task(task_id))
            task.configure()
            command = task._get_hook()._build_spark_submit_command(task.application)
            assert command[command.index("--master") + 1] == master
            conf = dict(
                command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf"
            )
            shipped = {k: v for k, v in conf.items() if k.startswith("spark.pyspark")}
            shipped.update({k: v for k, v in conf.items() if k == "spark.archives"})
            assert shipped == (
                {
                    "spark.archives": f"{archive.as_uri()}#environment",
                    "spark.pyspark.python": "./environment/bin/python",
                    "spark.pyspark.driver.python": sys.executable,
                }
                if ships
                else {}
            ), (dag_id, master)


def test_the_dags_spark_submit_runs_at_the_batch_layers_cpu_weight(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit starts through runtime.cpu_weight at SPARK_BATCH_NICE (its own session,
    niced: the API on the same host answers first), and as it is with 0."""
    bag = dag_bag(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    for nice, prefix in [
        (None, [sys.executable, "-m", "runtime.cpu_weight", "19"]),  # the default
        ("7", [sys.executable, "-m", "runtime.cpu_weight", "7"]),
        ("0", []),
    ]:
        if nice is None:
            monkeypatch.delenv("SPARK_BATCH_NICE", raising=False)
        else:
            monkeypatch.setenv("SPARK_BATCH_NICE", nice)
        task = copy.deepcopy(bag.dags["ctr_batch"].get_task("recompute_ctr"))
        task.configure()
        command = task._get_hook()._build_spark_submit_command(task.application)
        assert command[: len(prefix)] == prefix, nice
        assert command[len(prefix)].endswith("spark-submit"), command


def test_the_tasks_spark_driver_runs_niced_in_a_session_of_its_own(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The task's own hook submits a real application on local[1]: the driver spark-submit
    starts (its JVM's child) has the batch layer's niceness, leads no session of the test's,
    and its session has the same weight."""
    report = tmp_path / "weight.txt"
    application = tmp_path / "weight.py"
    application.write_text(
        "import os, pathlib, sys\n"
        "group = pathlib.Path('/proc/self/autogroup')\n"
        "pathlib.Path(sys.argv[1]).write_text(' '.join(map(str, [\n"
        "    os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0),\n"
        "    group.read_text().split()[-1] if group.exists() else '-'])))\n"
    )
    bag = dag_bag(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[1]"}')
    monkeypatch.setenv("SPARK_BATCH_NICE", "9")
    task = copy.deepcopy(bag.dags["ctr_batch"].get_task("recompute_ctr"))
    task.application, task.application_args = str(application), [str(report)]
    task.configure()
    hook = task._get_hook()
    hook.submit(task.application)
    hook._submit_sp.stdout.close()  # the provider reads it to the end but leaves it open
    nice, session, group_nice = report.read_text().split()
    assert int(nice) == 9
    assert int(session) != os.getsid(0)
    assert group_nice == ("9" if Path("/proc/self/autogroup").exists() else "-")


def test_the_demo_schedule_is_a_call_of_the_same_definition(airflow_env: dict[str, str]) -> None:
    # What infra/demo.sh generates: a run every 10 minutes, each with 20 minutes of lookback.
    from dags.definitions import ctr_batch_dag

    start = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC)
    demo = ctr_batch_dag(
        schedule="*/10 * * * *", lookback_minutes=20, start_date=start, catchup=True
    )
    assert getattr(demo.timetable, "summary", None) == "*/10 * * * *"
    assert demo.start_date == start
    assert demo.catchup is True
    assert demo.params["lookback_minutes"] == 20


@pytest.mark.timeout(600)
def test_airflow_dags_test_runs_the_batch_job(
    migrated: dict[str, str],
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    lake = new_lake(tmp_path)
    t = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    archive(
        spark,
        lake,
        [
            event("too-early", "impression", t - dt.timedelta(minutes=91)),
            event("in-lookback", "impression", t - dt.timedelta(minutes=90)),
            event("in-hour", "impression", t + dt.timedelta(minutes=30)),
            event("click", "click", t + dt.timedelta(minutes=30, seconds=5)),
            event("too-late", "impression", t + dt.timedelta(minutes=60)),
        ],
    )
    env = dict(migrated)
    env.update(
        LAKE_ROOT=str(lake.lake_root),
        CHECKPOINT_ROOT=str(lake.checkpoint_root),
        # Where Spark runs: the connection, not SPARK_MASTER.
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[1]"}),
        # The driver's size: spark-submit's --driver-memory (Spark's default would be 1 GiB).
        SPARK_DRIVER_MEMORY="1536m",
    )
    # A manual run at 13:00 gets the data interval that ends then, [12:00, 13:00); with a
    # lookback of 90 minutes (the run's conf, instead of the param's 120) it recomputes
    # [10:30, 13:00).
    conf = json.dumps({"lookback_minutes": 90})
    done = airflow(
        "dags test ctr_batch 2026-11-22T13:00:00+00:00", "--conf", conf, env=env, timeout=400
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "spark master: local[1]" in output, output[-5000:]
    heap = re.search(r"driver heap: ([\d,]+) MiB", output)
    assert heap is not None, output[-5000:]
    assert int(heap.group(1).replace(",", "")) > 1300  # 1536m less the JVM's survivor space
    rows = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table().to_pylist()
    assert sorted((r["bucket_start"], r["impressions"], r["clicks"]) for r in rows) == [
        (t - dt.timedelta(minutes=90), 1, 0),
        (t + dt.timedelta(minutes=30), 1, 1),
    ]
    [coverage] = DeltaTable(lake.table("batch/coverage")).to_pyarrow_table().to_pylist()
    assert (coverage["interval_start"], coverage["interval_end"]) == (
        t - dt.timedelta(minutes=90),
        t + dt.timedelta(hours=1),
    )
    assert coverage["run_id"].startswith("ctr-")


@pytest.mark.timeout(600)
def test_airflow_dags_test_recomputes_what_late_events_made_stale(
    migrated: dict[str, str],
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    from batch_layer.interval import Interval
    from batch_layer.job import run
    from lake.arrivals import arrival_rows, arrivals_table
    from lake.coverage.staleness import read_stale
    from views.ctr import ctr_arrow

    lake = new_lake(tmp_path)
    t = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    archive(spark, lake, [event("on-time", "impression", t + dt.timedelta(minutes=5))])
    run(spark, Interval(t, t + dt.timedelta(hours=1)), lake=lake)
    # Hours later, as the archiver would: two more events for 12:05, and their arrivals.
    late = [
        event("late-1", "impression", t + dt.timedelta(minutes=5, seconds=10)),
        event("late-2", "click", t + dt.timedelta(minutes=5, seconds=20)),
    ]
    archive(spark, lake, late)
    version = DeltaTable(MASTER_EVENTS.path(lake)).version()
    rows = arrival_rows(
        ctr_arrow(
            spark.read.format("delta")
            .load(MASTER_EVENTS.path(lake))
            .where("event_id LIKE 'late-%'")
            .toArrow()
        ),
        events_version=version,
        batch_id=1,
        archived_at=t + dt.timedelta(hours=6),
    )
    arrivals_table(lake).append(rows, app_id="test-archiver", version=1)
    assert [b.events for b in read_stale(lake)] == [2]

    env = dict(migrated)
    env.update(
        LAKE_ROOT=str(lake.lake_root),
        CHECKPOINT_ROOT=str(lake.checkpoint_root),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[1]"}),
    )
    done = airflow("dags test ctr_recompute_stale 2026-11-22T19:00:00+00:00", env=env, timeout=400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "spark master: local[1]" in output, output[-5000:]
    rows = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table().to_pylist()
    assert [(r["bucket_start"], r["impressions"], r["clicks"]) for r in rows] == [
        (t + dt.timedelta(minutes=5), 2, 1)
    ]
    assert read_stale(lake) == []

    # Nothing stale: the check skips the Spark task.
    again = airflow("dags test ctr_recompute_stale 2026-11-22T19:10:00+00:00", env=env, timeout=400)
    assert again.returncode == 0, (again.stdout + again.stderr)[-5000:]
    assert "spark master" not in again.stdout + again.stderr


@pytest.mark.timeout(600)
def test_airflow_dags_test_reprocesses_a_view_version(
    migrated: dict[str, str],
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    from batch_layer.interval import Interval
    from batch_layer.job import run
    from lake.registry import read_registry

    lake = new_lake(tmp_path)
    t = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    archive(
        spark,
        lake,
        [
            event("phone", "impression", t + dt.timedelta(minutes=5)),
            {**event("bot", "impression", t + dt.timedelta(minutes=6)), "device_type": "other"},
        ],
    )
    run(spark, Interval(t, t + dt.timedelta(hours=1)), lake=lake)
    env = dict(migrated)
    env.update(
        LAKE_ROOT=str(lake.lake_root),
        CHECKPOINT_ROOT=str(lake.checkpoint_root),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[1]"}),
    )

    # Half the rows change (v2 drops the 'other' one): over a 10 % threshold, it stops for review.
    strict = json.dumps({"view": "ctr", "version": 2, "max_changed_fraction": 0.1})
    stopped = airflow(
        "dags test ctr_reprocess 2026-11-22T19:00:00+00:00", "--conf", strict, env=env, timeout=400
    )
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 0, output[-5000:]
    assert "stopping for review" in output, output[-5000:]
    registry = read_registry(lake)
    assert (registry.published("ctr").version, registry.state("ctr", 2)) == (1, "ready")

    lenient = json.dumps({"view": "ctr", "version": 2, "max_changed_fraction": 0.6})
    done = airflow(
        "dags test ctr_reprocess 2026-11-22T19:05:00+00:00", "--conf", lenient, env=env, timeout=400
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert read_registry(lake).published("ctr").version == 2
    rows = DeltaTable(lake.table("batch/ctr_v2")).to_pyarrow_table().to_pylist()
    assert [(r["bucket_start"], r["device_type"], r["impressions"]) for r in rows] == [
        (t + dt.timedelta(minutes=5), "mobile", 1)
    ]
