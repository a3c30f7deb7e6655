"""Where Spark runs and how (environment variables SPARK_*)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.private import DEFAULT_UMASK, parse_umask
from runtime.python_archive import DEFAULT_ARCHIVE


def default_jar_cache(environ: Mapping[str, str]) -> Path:
    """Where ``make setup`` puts the jar sets when ``CTR_JAR_CACHE`` is not set (as
    ``infra/jars.sh`` does): ``$XDG_CACHE_HOME/ctr-lambda/jars``, else ``~/.cache/...``."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ctr-lambda" / "jars"


class SparkSettings(BaseSettings):
    """Where Spark runs (environment variables ``SPARK_*``)."""

    model_config = SettingsConfigDict(env_prefix="SPARK_", extra="ignore")

    # Where Spark runs: local[N] (N cores in this process), spark://host:7077, yarn or
    # k8s://…; anything else is refused. A job under spark-submit keeps its --master instead.
    master: str = "local[2]"
    # The application's name, as Spark's UI and the cluster manager show it.
    app_name: str = "ctr-lambda"
    # Partitions of every shuffle (spark.sql.shuffle.partitions): the tasks of each join and
    # aggregation.
    shuffle_partitions: int = Field(default=4, ge=1)
    # Spark's web UI (spark.ui.enabled); off: no UI port is opened.
    ui_enabled: bool = False
    # The driver's heap (JVM size, e.g. 2g), however the job starts: `ctr` starts its driver
    # JVM with it, spark-submit (the Airflow tasks) gets --driver-memory (submit_args).
    driver_memory: str = "2g"
    # Each executor's heap (e.g. 4g): spark.executor.memory, --executor-memory for
    # spark-submit. Unset: Spark's default, 1g.
    executor_memory: str | None = None
    # Cores per executor: spark.executor.cores, --executor-cores for spark-submit. Unset:
    # Spark's default (on a standalone cluster, all of a worker's cores).
    executor_cores: int | None = Field(default=None, ge=1)
    # A fixed number of executors on YARN or Kubernetes: spark.executor.instances,
    # --num-executors for spark-submit. Unset: Spark's default.
    num_executors: int | None = Field(default=None, ge=1)
    # Executors added and removed with the work (shuffle tracking: no external shuffle service).
    dynamic_allocation: bool = False
    # The niceness of batch jobs (`ctr batch`, `ctr backfill`, `ctr views build`, the Airflow
    # tasks' spark-submit) and of what they start (their JVM, its Python workers), and, in a
    # session of their own, of that session (runtime.cpu_weight): on a host they share with the
    # API, the API's answers come first (19: the dashboards answer beside a batch run as they
    # do alone, python -m bench beside-batch). 0: the same weight as everything else.
    batch_nice: int = Field(default=19, ge=0, le=19)
    # Anything else, e.g. object-store credentials {"spark.hadoop.fs.s3a.access.key": "…"}.
    conf: dict[str, str] = Field(default_factory=dict)
    # The Python interpreter Spark's Python workers run on local[N], and the driver's under
    # spark-submit (PySpark's own variable). Default: the one running `ctr`, which has pyarrow,
    # msgspec, ... On a cluster the executors run the packed environment's (SPARK_PYTHON_ARCHIVE),
    # or this one when none is shipped: then every node must have it, with the project.
    python: str = Field(default_factory=lambda: sys.executable, validation_alias="PYSPARK_PYTHON")
    # The packed Python environment (`make python-archive`: the project's wheel and its
    # dependencies, dist/ctr-lambda-python.tar.gz) that jobs on spark://, yarn or k8s:// ship to
    # their executors (spark.archives), whose Python workers run it: a path, or a URL the
    # cluster fetches (hdfs://, s3a://, https://). local[N] ships nothing. Empty: nothing is
    # shipped, every node has the project installed.
    python_archive: str = Field(default_factory=lambda: str(DEFAULT_ARCHIVE))
    # The address the driver binds and advertises (spark.driver.bindAddress and .host; Spark's
    # own variable). Executors on other machines need an address they can reach.
    local_ip: str = Field(default="127.0.0.1", validation_alias="SPARK_LOCAL_IP")
    # Where the sessions `ctr` starts itself write Spark's warnings (only errors reach the
    # console); empty: Spark's default, everything on the console. Jobs under spark-submit
    # keep Spark's default.
    log_file: str = Field(
        default_factory=lambda: os.path.join(os.environ.get("RUN_DIR", "run"), "logs", "spark.log")
    )
    # What Hadoop takes away from the permissions of the files it writes itself (data files,
    # checkpoints): the platform's umask, CTR_UMASK (octal, e.g. 077; runtime.private).
    umask: int = Field(
        default=DEFAULT_UMASK,
        ge=0,
        le=0o777,
        validation_alias="CTR_UMASK",
        json_schema_extra={"octal": True},
    )
    # The jar sets `make setup` fetched (runtime.jars): the connectors', the S3 connector's.
    jar_cache: Path = Field(
        default_factory=lambda: default_jar_cache(os.environ), validation_alias="CTR_JAR_CACHE"
    )

    @field_validator("master")
    @classmethod
    def _check_master(cls, value: str) -> str:
        if not value.startswith(("local", "spark://", "yarn", "k8s://")):
            raise ValueError(f"SPARK_MASTER={value!r} is not local[N], spark://…, yarn or k8s://…")
        return value

    @field_validator("umask", mode="before")
    @classmethod
    def _octal(cls, value: object) -> object:
        return parse_umask(value) if isinstance(value, str) else value

    @field_validator("jar_cache", mode="before")
    @classmethod
    def _cache_or_default(cls, value: object) -> object:
        return default_jar_cache(os.environ) if value == "" else value

    def resources(self) -> dict[str, str]:
        """The Spark settings of the resources above (those set)."""
        conf = {"spark.driver.memory": self.driver_memory}
        if self.executor_memory:
            conf["spark.executor.memory"] = self.executor_memory
        if self.executor_cores:
            conf["spark.executor.cores"] = str(self.executor_cores)
        if self.num_executors:
            conf["spark.executor.instances"] = str(self.num_executors)
        if self.dynamic_allocation:
            conf["spark.dynamicAllocation.enabled"] = "true"
            conf["spark.dynamicAllocation.shuffleTracking.enabled"] = "true"
        return conf

    def submit_args(self) -> list[str]:
        """The resources and ``conf`` as spark-submit arguments: a driver under spark-submit
        is running before the job's code builds its session, so what sizes it must be on the
        command line (Spark ignores ``spark.driver.memory`` set in a running driver)."""
        args = ["--driver-memory", self.driver_memory]
        if self.executor_memory:
            args += ["--executor-memory", self.executor_memory]
        if self.executor_cores:
            args += ["--executor-cores", str(self.executor_cores)]
        if self.num_executors:
            args += ["--num-executors", str(self.num_executors)]
        extra = {k: v for k, v in self.resources().items() if k.startswith("spark.dynamic")}
        for key, value in {**extra, **self.conf}.items():
            args += ["--conf", f"{key}={value}"]
        return args
