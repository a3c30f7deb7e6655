"""The SparkSession every job runs on, and the switch between Python and JVM connectors.

Locally there are no spark-sql-kafka or delta-spark jars (Maven is out of reach), so Kafka and
Delta go through this project's Python data sources (``connectors/``). A deployment that has the
jars sets ``SPARK_KAFKA_FORMAT=kafka`` and ``SPARK_DELTA_FORMAT=delta`` plus the packages in
``SPARK_CONF``; no code changes.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PYTHON_KAFKA_FORMAT: Final = "ctr-kafka"
PYTHON_DELTA_FORMAT: Final = "ctr-delta"


class SparkSettings(BaseSettings):
    """Where Spark runs and which connectors it uses (environment variables ``SPARK_*``)."""

    model_config = SettingsConfigDict(env_prefix="SPARK_", extra="ignore")

    master: str = "local[2]"
    app_name: str = "ctr-lambda"
    shuffle_partitions: int = Field(default=4, ge=1)
    kafka_format: Literal["ctr-kafka", "kafka"] = PYTHON_KAFKA_FORMAT
    delta_format: Literal["ctr-delta", "delta"] = PYTHON_DELTA_FORMAT
    ui_enabled: bool = False
    driver_memory: str = "2g"
    # Anything else, e.g. {"spark.jars.packages": "...", "spark.sql.extensions": "..."}.
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("master")
    @classmethod
    def _check_master(cls, value: str) -> str:
        if not value.startswith(("local", "spark://", "yarn", "k8s://")):
            raise ValueError(f"SPARK_MASTER={value!r} is not local[N], spark://…, yarn or k8s://…")
        return value


def spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """Build (or return the running) SparkSession with the project's data sources registered."""
    settings = settings or SparkSettings()
    # Executors' Python must be this interpreter (it has pyarrow, msgspec, deltalake...).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.ui.enabled", str(settings.ui_enabled).lower())
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    conf: dict[str, Any] = dict(settings.conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_data_sources(spark)
    return spark


def register_data_sources(spark: SparkSession) -> None:
    from connectors.delta_sink import DeltaDataSource
    from connectors.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(DeltaDataSource)
