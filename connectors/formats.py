"""Reading Kafka and reading/writing Delta through whichever connector is configured.

Jobs call these instead of ``format(...)`` directly, so switching between the Python connectors
(``ctr-kafka``, ``ctr-delta``) and the JVM ones (``kafka``, ``delta``) is a settings change:
``SPARK_KAFKA_FORMAT`` and ``SPARK_DELTA_FORMAT`` (see ``infra.spark``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from infra.kafka_settings import KafkaSettings
from infra.spark import PYTHON_DELTA_FORMAT, SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession
    from pyspark.sql.streaming import DataStreamReader


def kafka_options(kafka: KafkaSettings, topics: Sequence[str]) -> dict[str, str]:
    """Spark kafka-source options for these settings (client config as ``kafka.*``)."""
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": ",".join(topics)}
    options.update({f"kafka.{k}": str(v) for k, v in kafka.client_config.items()})
    return options


def read_kafka(
    spark: SparkSession,
    kafka: KafkaSettings,
    *,
    stream: bool,
    spark_settings: SparkSettings,
    topics: Sequence[str] | None = None,
    **options: str,
) -> DataFrame:
    """The event topic (or ``topics``) as a DataFrame with Spark's kafka-source columns."""
    reader: DataFrameReader | DataStreamReader = spark.readStream if stream else spark.read
    reader = reader.format(spark_settings.kafka_format)
    for key, value in {**kafka_options(kafka, topics or [kafka.topic]), **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def write_delta(
    df: DataFrame,
    path: str,
    *,
    spark_settings: SparkSettings,
    mode: str = "append",
    partition_by: Sequence[str] = (),
    replace_where: str | None = None,
    txn: tuple[str, int] | None = None,
) -> None:
    """Write ``df`` to the Delta table at ``path``; ``txn`` = (application id, version) makes
    the write idempotent (a replay of the same version is a no-op)."""
    writer = df.write.format(spark_settings.delta_format).mode(mode)
    if partition_by:
        if spark_settings.delta_format == PYTHON_DELTA_FORMAT:
            writer = writer.option("partitionBy", ",".join(partition_by))
        else:
            writer = writer.partitionBy(*partition_by)
    if replace_where:
        writer = writer.option("replaceWhere", replace_where)
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
    writer.save(path)


def read_delta(
    spark: SparkSession,
    path: str,
    *,
    spark_settings: SparkSettings,
    version: int | None = None,
    partitions: dict[str, list[str]] | None = None,
) -> DataFrame:
    """The Delta table at ``path`` (its latest version, or ``version``) as a DataFrame;
    ``partitions`` ({column: [values]}) keeps only those partitions' files."""
    if spark_settings.delta_format != PYTHON_DELTA_FORMAT:
        reader = spark.read.format(spark_settings.delta_format)
        if version is not None:
            reader = reader.option("versionAsOf", version)
        frame = reader.load(path)
        for column, values in (partitions or {}).items():
            frame = frame.where(frame[column].cast("string").isin(values))
        return frame
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    table = DeltaTable(path, version=version)
    schema = from_arrow_schema(pa.schema(table.schema().to_arrow()))
    filters = [(column, "in", values) for column, values in (partitions or {}).items()]
    files = table.file_uris(file_pruning_predicate=filters or None)
    if not files:
        return spark.createDataFrame([], schema)
    frame = spark.read.schema(schema).option("basePath", path).parquet(*files)
    return frame.select(*schema.fieldNames())  # partition columns back in table order
