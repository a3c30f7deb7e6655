"""Test hosts in the tests (:mod:`infra.hosts`): ``with new_hosts(tmp_path_factory) as hosts``
gives hosts of the test's own, skipped with the reason where this machine cannot make them;
a Spark standalone master and workers started on hosts.

    with new_hosts(tmp_path_factory) as hosts:
        cluster = spark_cluster(hosts, workers=2, bare=True)
        driver = hosts.host("driver").start("speed", [python, "-m", "cli.main", "speed"], env=env)
        ...
        driver.kill()  # SIGKILL to its process group; driver.output() is its log
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.broker import free_port
from infra.hosts import HOME, Host, HostProcess, Hosts, Machine, unavailable
from runtime.jars import jar_dir
from runtime.spark_settings import SparkSettings
from tests.support.waiting import wait_until


@contextmanager
def new_hosts(factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Hosts under a fresh folder of ``factory``, all stopped at the end; the test skips, with
    the reason, on a machine that cannot make them (not root, no unshare)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"test hosts cannot be made here: {reason}")
    # Every host hides /tmp; the test's tmp folders too where they are elsewhere.
    folders = {factory.getbasetemp().resolve(), Path(tempfile.gettempdir()).resolve()}
    hidden = [p for p in folders if not p.is_relative_to("/tmp")]
    machine = Machine.of(os.environ, jar_cache=SparkSettings().jar_cache, hidden=hidden)
    with Hosts(factory.mktemp("hosts"), machine) as hosts:
        yield hosts


@dataclass(frozen=True)
class SparkCluster:
    """A Spark standalone cluster on test hosts: its master's ``url`` and processes."""

    url: str
    master: HostProcess
    workers: tuple[HostProcess, ...]
    hosts: tuple[Host, ...]


def spark_env(host: Host) -> dict[str, str]:
    """What Spark's scripts need on ``host``: its Spark, in the foreground (the host's address
    is SPARK_LOCAL_IP already)."""
    return {"SPARK_HOME": str(host.spark_home), "SPARK_NO_DAEMONIZE": "1"}


def spark_cluster(
    hosts: Hosts,
    *,
    workers: int = 1,
    bare: bool = True,
    cores: int = 1,
    memory: str = "1g",
    keep: Sequence[Path] | None = None,
) -> SparkCluster:
    """A master on a host ``spark-master`` and ``workers`` workers on hosts ``spark-worker-N``
    (bare by default: Spark and Python only, plus ``keep``, by default the S3 connector's jars
    where the jobs' spark.executor.extraClassPath names them, as a cluster's image has them),
    each with ``cores`` and ``memory``; returned once every worker has registered."""
    if keep is None:
        keep = [jar_dir("s3", hosts.machine.jar_cache)]
    master_host = hosts.host("spark-master", bare=bare)
    port = free_port()
    url = f"spark://{master_host.address}:{port}"
    command = [str(master_host.spark_home / "bin" / "spark-class")]
    command += ["org.apache.spark.deploy.master.Master", "--host", master_host.address]
    command += ["--port", str(port), "--webui-port", str(free_port())]
    master = master_host.start("master", command, env=spark_env(master_host))
    started = []
    worker_hosts = []
    for n in range(workers):
        host = hosts.host(f"spark-worker-{n}", bare=bare, keep=keep)
        command = [str(host.spark_home / "bin" / "spark-class")]
        command += ["org.apache.spark.deploy.worker.Worker", url, "--host", host.address]
        command += ["--cores", str(cores), "--memory", memory, "--webui-port", str(free_port())]
        command += ["--work-dir", str(HOME / "work")]
        started.append(host.start("worker", command, env=spark_env(host)))
        worker_hosts.append(host)
    wait_until(
        lambda: (
            master.output().count("Registering worker") >= workers
            or not all(p.alive() for p in [master, *started])
        ),
        timeout_s=180,
        what=f"{workers} worker(s) registered with the master (its log: {master.log})",
        poll_s=0.5,
    )
    dead = [p for p in [master, *started] if not p.alive()]
    assert not dead, "\n".join(f"{p.name} died:\n{p.output()[-3000:]}" for p in dead)
    return SparkCluster(url, master, tuple(started), (master_host, *worker_hosts))
