"""The SparkSession every job runs on: Spark's kafka source and delta-spark on its classpath.

The connector jars come from the jar cache `make setup` filled (``infra/spark/pom.xml``: the
kafka source and delta-spark with their dependencies, less what pyspark ships); they are passed
as local paths (``spark.jars``), so a job start never resolves packages over the network, and
the driver serves them to the executors of a standalone cluster. Delta's SQL extension and
catalog are configured, and every table delta-spark creates keeps to the Delta features that
delta-rs and DuckDB read (no deletion vectors, classic checkpoints, no column mapping).

On a cluster (``spark://``, ``yarn``, ``k8s://``) every job also ships the project's code
and its dependencies, packed (:mod:`runtime.python_archive`, ``spark.archives``): a worker
needs Spark and a Python, not this repository. ``local[N]`` ships nothing.

``python -m runtime.spark`` prints the same as ``spark-submit`` arguments (the Airflow DAG's
spark-submit uses them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime import cpu_weight
from runtime.jars import JarsMissingError, jars
from runtime.object_store import ObjectStoreSettings, spark_conf
from runtime.python_archive import EXECUTOR_PYTHON, is_cluster, shipped_conf
from runtime.spark_settings import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What keeps delta-spark's tables readable by delta-rs and DuckDB's delta extension: table
# properties every new table gets (spark.databricks.delta.properties.defaults.*).
DELTA_TABLE_DEFAULTS: Final = {
    "enableDeletionVectors": "false",
    "checkpointPolicy": "classic",
    "columnMapping.mode": "none",
}
_VERSIONED_JAR: Final = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


@cache
def connector_jars(jar_cache: Path) -> tuple[str, ...]:
    """Local paths of the connector jars (in the jar cache ``jar_cache``): the jar set
    ``spark`` less every artifact Spark already ships (Spark's own version of a shared library
    wins), Spark being the one this process runs on: under spark-submit, pyspark is imported
    from ``$SPARK_HOME/python/lib/pyspark.zip``, beside which there is no ``jars/`` folder."""
    from pyspark.find_spark_home import _find_spark_home

    spark_jars = Path(_find_spark_home()) / "jars"
    shipped = {_artifact(p.name) for p in spark_jars.glob("*.jar")}
    if not shipped:
        raise JarsMissingError(f"Spark's own jars are not in {spark_jars}: is SPARK_HOME right?")
    return tuple(str(p) for p in jars("spark", jar_cache) if _artifact(p.name) not in shipped)


def _artifact(file_name: str) -> str:
    match = _VERSIONED_JAR.match(file_name)
    return match.group("artifact") if match else file_name


@cache
def s3_jars(jar_cache: Path) -> tuple[str, ...]:
    """Local paths of the S3 connector's jars (the jar set ``s3`` in ``jar_cache``)."""
    return tuple(str(p) for p in jars("s3", jar_cache))


def connector_conf(store: ObjectStoreSettings, *, umask: int, jar_cache: Path) -> dict[str, str]:
    """The Spark settings that bring in the connectors (from the jar cache ``jar_cache``) and
    configure Delta; with the lake on the object store ``store``, Hadoop's S3A too
    (``runtime.object_store``). ``umask``: what Hadoop takes away from the permissions of its
    files (``SparkSettings.umask``, as the process's own: ``runtime.private``)."""
    conf = {
        "spark.jars": ",".join(connector_jars(jar_cache)),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # INT96 timestamps (Spark's default) are a legacy encoding: micros, as Delta expects.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # speed/ctr keeps an hour of history; Delta refuses a VACUUM under 7 days without this.
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        # Options whose values plans, logs and the UI show as *********(redacted): Spark's own
        # (URLs) and a secured Kafka cluster's (kafka.sasl.jaas.config holds the password).
        "spark.sql.redaction.options.regex": "(?i)url|jaas|password|secret|token",
        # Hadoop sets the permissions of what it writes itself (data files, checkpoints), from
        # this setting, not from the process's umask (runtime.private).
        "spark.hadoop.fs.permissions.umask-mode": f"{umask:03o}",
    }
    for name, value in DELTA_TABLE_DEFAULTS.items():
        conf[f"spark.databricks.delta.properties.defaults.{name}"] = value
    if store.in_use:
        # On the class path of the driver and the executors, not shipped with each application
        # (spark.jars): the AWS SDK bundle is 690 MB. A cluster's nodes have them at the same
        # path (make setup's jar cache here; an image's jars elsewhere).
        classpath = os.pathsep.join(s3_jars(jar_cache))
        conf["spark.driver.extraClassPath"] = classpath
        conf["spark.executor.extraClassPath"] = classpath
        conf.update(spark_conf(store))
    return conf


def shipped(settings: SparkSettings, master: str) -> dict[str, str]:
    """The Spark settings that ship the code to the executors of a job on ``master``: on a
    cluster, the packed environment ``settings.python_archive`` (its executors' Python workers
    run its interpreter, the driver ``settings.python``); on local[N], none."""
    if not is_cluster(master):
        return {}
    return shipped_conf(settings.python_archive, driver_python=settings.python)


def spark_session(
    settings: SparkSettings,
    store: ObjectStoreSettings,
    *,
    submitted: bool = False,
    batch: bool = False,
) -> SparkSession:
    """Build (or return the running) SparkSession with the connectors on its classpath, able
    to read and write the lake's object store ``store`` when the lake is there.

    ``submitted``: the job runs under ``spark-submit``, which chose the master (``--master``):
    the session keeps it rather than setting ``settings.master``, and the code it ships came on
    spark-submit's command line (:func:`submit_args`).

    ``batch``: a batch job's session: if this call starts the JVM, this process and what it
    starts run at the batch layer's CPU weight (``settings.batch_nice``, runtime.cpu_weight).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if batch and SparkContext._active_spark_context is None:
        cpu_weight.lower(settings.batch_nice)

    # Python workers run settings.python, or on a cluster the shipped environment's: the conf
    # for executors a cluster starts, and PYSPARK_PYTHON while the context starts (PySpark
    # takes its pythonExec, what every executor runs, from it).
    ships = {} if submitted else shipped(settings, settings.master)
    python = settings.python

    builder = SparkSession.builder if submitted else SparkSession.builder.master(settings.master)
    builder = (
        builder.appName(settings.app_name)
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.ui.enabled", str(settings.ui_enabled).lower())
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", python)
        .config("spark.driver.bindAddress", settings.local_ip)
        .config("spark.driver.host", settings.local_ip)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    # The resources (spark.driver.memory among them) reach the JVM PySpark starts here as
    # spark-submit arguments; under spark-submit they came on its command line (submit_args).
    conf: dict[str, Any] = {
        **connector_conf(store, umask=settings.umask, jar_cache=settings.jar_cache),
        **settings.resources(),
        **ships,
        **settings.conf,
    }
    if not submitted and settings.log_file:
        conf["spark.driver.extraJavaOptions"] = " ".join(
            filter(
                None, [_log_options(settings.log_file), conf.get("spark.driver.extraJavaOptions")]
            )
        )
    for key, value in conf.items():
        builder = builder.config(key, value)
    # The JVM reads SPARK_LOCAL_IP from its environment only (no conf says it): without it, it
    # picks a non-loopback interface for its own addresses. PySpark starts the JVM with a copy
    # of os.environ, so the variables are there while it starts and removed again after.
    executors = {"PYSPARK_PYTHON": EXECUTOR_PYTHON} if ships else {}
    with _jvm_environment(
        {"SPARK_LOCAL_IP": settings.local_ip, "PYSPARK_PYTHON": python}, replace=executors
    ):
        spark = builder.getOrCreate()
    for key, value in _local_conf(spark.sparkContext.master or settings.master).items():
        if key not in settings.conf:
            spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _log_options(log_file: str) -> str:
    """The driver's JVM options that send Spark's warnings to ``log_file`` (its folder made),
    errors to the console too (runtime/spark-log4j2.properties)."""
    path = Path(log_file).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    config = Path(__file__).with_name("spark-log4j2.properties")
    return f"-Dlog4j.configurationFile={config} -Dctr.spark.log={path}"


@contextmanager
def _jvm_environment(
    variables: dict[str, str], *, replace: dict[str, str] | None = None
) -> Iterator[None]:
    """``variables`` in os.environ (where not set already) and ``replace`` (whatever was set)
    for the block, then as before."""
    replace = replace or {}
    before = {name: os.environ.get(name) for name in [*variables, *replace]}
    os.environ.update({k: v for k, v in variables.items() if k not in os.environ})
    os.environ.update(replace)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _local_conf(master: str) -> dict[str, str]:
    """On local[N], Delta reconstructs a table's snapshot in N partitions, not its default 50:
    50 tasks per snapshot update cost each small delta-spark commit ~2.5 s on 2 cores."""
    match = re.fullmatch(r"local\[(\d+|\*)\]|local", master)
    if match is None:
        return {}
    cores = match.group(1)
    if cores is None:
        count = 1
    elif cores == "*":
        count = os.cpu_count() or 1
    else:
        count = int(cores)
    return {"spark.databricks.delta.snapshotPartitions": str(count)}


def submit_args(settings: SparkSettings, store: ObjectStoreSettings) -> list[str]:
    """``spark-submit`` arguments for the connectors (the lake's object store ``store``
    among them), the code shipped to a cluster's executors (when ``settings.master`` is one:
    :func:`shipped`) and the resources of ``settings``: a job under spark-submit has its JVM
    before it builds its session, so the jars, the archives and the driver's memory must be on
    the command line."""
    conf = connector_conf(store, umask=settings.umask, jar_cache=settings.jar_cache)
    conf.update(shipped(settings, settings.master))
    args = ["--jars", conf.pop("spark.jars")]
    for key, value in conf.items():
        if key.startswith("spark.executorEnv."):
            continue  # credentials: not on a command line (the session sets them)
        args += ["--conf", f"{key}={value}"]
    return args + settings.submit_args()


if __name__ == "__main__":
    # The store of the lake LAKE_ROOT names (runtime sits below lake.settings).
    print(" ".join(submit_args(SparkSettings(), ObjectStoreSettings())))
