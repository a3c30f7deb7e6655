"""The batch job on a Spark standalone cluster whose master and two workers run on bare test
hosts (Spark and Python only: no checkout, no .venv; infra.hosts), submitted from a host with
the checkout as an Airflow worker submits it, the lake on the local S3 server: the executors
run the environment the job ships (spark.archives), and the rows are local mode's. Nothing
depends on local mode, on a shared checkout or on a shared disk."""

from __future__ import annotations

import datetime as dt
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from batch_layer.interval import Interval
from batch_layer.job import run
from infra.hosts import HOME, Host, Hosts
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from lake.settings import LakeSettings
from lake.storage import open_delta
from runtime.object_store import ObjectStoreSettings
from runtime.python_archive import MANIFEST_NAME
from runtime.spark import submit_args
from runtime.spark_settings import SparkSettings
from tests.support import ROOT
from tests.support.events import archive, event
from tests.support.hosts import SparkCluster, new_hosts, spark_cluster


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    run_dir = tmp_path_factory.mktemp("s3-run")
    store = LocalS3(LocalS3Settings(run_dir=run_dir, port=free_base_port(), bucket="cluster"))
    assert store.start()
    try:
        yield store
    finally:
        store.stop(discard=True)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    with new_hosts(tmp_path_factory) as made:
        yield made


@dataclass(frozen=True)
class Site:
    """The cluster on bare hosts, the host that submits to it, and the object store."""

    cluster: SparkCluster
    submitter: Host
    store: ObjectStoreSettings


@pytest.fixture(scope="module")
def site(hosts: Hosts, s3: LocalS3) -> Site:
    """Two workers on bare hosts (that keep the S3 connector's jars where the jobs'
    spark.executor.extraClassPath names them, as a cluster's image would); the driver on a
    host with the checkout (read-only), as on an Airflow worker."""
    cluster = spark_cluster(hosts, workers=2, bare=True)
    store = ObjectStoreSettings.model_validate(s3.environment())
    return Site(cluster, hosts.host("airflow-worker"), store)


@pytest.mark.timeout(600)
def test_batch_job_on_bare_workers_matches_local_mode(
    site: Site, spark: SparkSession, python_archive: Path, tmp_path: Path
) -> None:
    cluster, store = site.cluster, site.store
    local = LakeSettings(lake_root=tmp_path / "local", checkpoint_root=tmp_path / "ck")
    prefix = f"s3://cluster/lake-{uuid.uuid4().hex[:8]}"
    shared = LakeSettings(lake_root=prefix, checkpoint_root=tmp_path / "ck2", object_store=store)
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
    archive(spark, shared, events)
    run(spark, Interval(t, t + dt.timedelta(hours=2)), lake=local)

    # The driver's lake and settings from its environment, as an Airflow worker has them; the
    # code reaches the executors in the archive.
    settings = SparkSettings(master=cluster.url, python_archive=str(python_archive))
    spark_submit = str(site.submitter.venv_command("spark-submit"))
    submit = [spark_submit, *submit_args(settings, shared.object_store), "--master", cluster.url]
    submit += ["--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=2"]
    job = [str(ROOT / "cli" / "submit.py")]
    job += ["--start", "2026-11-22T10:00:00Z", "--end", "2026-11-22T12:00:00Z"]
    env = {
        **store.environment(),
        "LAKE_ROOT": prefix,
        "CHECKPOINT_ROOT": str(HOME / "checkpoints"),
        "PYSPARK_PYTHON": sys.executable,
    }
    done = site.submitter.run([*submit, *job], env=env, timeout_s=400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert f"spark master: {cluster.url}" in done.stdout

    def rows(lake: LakeSettings) -> list[dict[str, object]]:
        table = open_delta(lake.table("batch/ctr"), lake.object_store).to_pyarrow_table()
        return sorted(table.to_pylist(), key=lambda r: (r["bucket_start"], r["ad_id"]))

    local_rows, cluster_rows = rows(local), rows(shared)
    assert len(local_rows) > 50
    assert cluster_rows == local_rows
    # The tasks ran on the bare workers, with the environment the job shipped, unpacked there.
    unpacked = [
        path
        for host in cluster.hosts[1:]
        for path in host.outside(HOME / "work").glob(f"app-*/*/environment/{MANIFEST_NAME}")
    ]
    assert unpacked, [p.output()[-2000:] for p in cluster.workers]
    # The connectors travel with the job, not the jars of Spark's own that the workers have.
    fetched = {
        path.name
        for host in cluster.hosts[1:]
        for path in host.outside(HOME / "work").glob("app-*/*/*.jar")
    }
    assert "delta-spark_4.2_2.13-4.4.0.jar" in fetched
    assert not {name for name in fetched if name.startswith(("hadoop-client", "scala-library"))}
