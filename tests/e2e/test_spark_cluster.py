"""The batch job on a Spark standalone cluster (a master and 2 workers from the pyspark
distribution, on 127.0.0.1) gives the same rows as local mode: nothing depends on local mode."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from batch_layer.interval import Interval
from batch_layer.job import run
from infra.broker import free_port
from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from runtime.spark import submit_args
from runtime.spark_settings import SparkSettings
from tests.support import ROOT
from tests.support.events import archive, event
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("spark-cluster")
    # spark-class finds the Spark distribution by importing pyspark with PYSPARK_PYTHON.
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
    }
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = [(work / name).open("wb") for name in ("master.log", "worker0.log", "worker1.log")]
    master = [str(BIN / "spark-class"), "org.apache.spark.deploy.master.Master"]
    master += ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())]
    processes = [
        subprocess.Popen(
            master, env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True
        )
    ]
    for n in range(2):
        processes.append(
            subprocess.Popen(
                [
                    str(BIN / "spark-class"),
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work / f"worker{n}"),
                ],
                env=env,
                stdout=logs[n + 1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        wait_until(
            lambda: (
                (work / "master.log").read_text(errors="replace").count("Registering worker") >= 2
            ),
            timeout_s=180,
            what="both workers registered with the master (see master.log)",
            poll_s=0.5,
        )
        yield url
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)
        for log in logs:
            log.close()


@pytest.mark.timeout(600)
def test_batch_job_on_a_standalone_cluster_matches_local_mode(
    spark_cluster: str, spark: SparkSession, tmp_path: Path
) -> None:
    local = LakeSettings(lake_root=tmp_path / "local", checkpoint_root=tmp_path / "ck")
    t = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    events = [
        event(
            f"e{n}",
            "click" if n % 7 == 0 else "impression",
            t + dt.timedelta(seconds=37 * n),
            ad=f"ad-{n % 3}",
            offset=n,
        )
        for n in range(200)
    ]
    events.append(event("e5", "impression", t + dt.timedelta(seconds=185), ad="ad-2", offset=999))
    archive(spark, local, events)
    cluster = LakeSettings(lake_root=tmp_path / "cluster", checkpoint_root=tmp_path / "ck2")
    shutil.copytree(MASTER_EVENTS.path(local), MASTER_EVENTS.path(cluster))

    interval = Interval(t, t + dt.timedelta(hours=2))
    run(spark, interval, lake=local)
    env = {
        **os.environ,
        "LAKE_ROOT": str(cluster.lake_root),
        "SPARK_MASTER": spark_cluster,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    submit = [str(BIN / "spark-submit"), *submit_args(SparkSettings(), cluster.object_store)]
    submit += ["--master", spark_cluster]
    submit += ["--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=2"]
    job = [str(ROOT / "cli" / "submit.py")]
    job += ["--start", "2026-11-22T10:00:00Z", "--end", "2026-11-22T12:00:00Z"]
    done = subprocess.run(
        [*submit, *job], env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert f"spark master: {spark_cluster}" in done.stdout

    def rows(lake: LakeSettings) -> list[dict[str, object]]:
        table = DeltaTable(lake.table("batch/ctr")).to_pyarrow_table().to_pylist()
        return sorted(table, key=lambda r: (r["bucket_start"], r["ad_id"]))

    local_rows, cluster_rows = rows(local), rows(cluster)
    assert len(local_rows) > 50
    assert cluster_rows == local_rows
