"""Reading Kafka, and reading and writing Delta tables, the way every job does it.

Spark's ``kafka`` source and delta-spark's ``delta`` format (their jars are on every session's
classpath: see ``runtime.spark``). Options a job needs are named here once: the client
configuration and credentials of a secured cluster, time travel. Spark reads the lake; its
results are committed by delta-rs (``lake.frames``), whose conflicts :func:`is_commit_conflict`
recognises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from runtime.kafka_settings import KafkaSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession
    from pyspark.sql.streaming import DataStreamReader

# The consumer-group ids of Spark's kafka source start with the reader's prefix
# (``groupIdPrefix``; Spark's own, ``spark-kafka-source-``, otherwise): a cluster with ACLs
# grants the consumer login these prefixes (infra/broker/acls.py, docs/guides/kafka.md).
ARCHIVER_GROUP: Final = "ctr-archiver"
SPEED_GROUP: Final = "ctr-speed"


def kafka_options(kafka: KafkaSettings, topics: Sequence[str]) -> dict[str, str]:
    """Spark kafka-source options for these settings: the cluster, its security settings and
    credentials (:meth:`KafkaSettings.spark_options`), and the topics."""
    return {**kafka.spark_options(), "subscribe": ",".join(topics)}


# Records one poll of the Spark kafka source's consumer returns (Kafka's default: 500). A task
# reads its partitions' offset range in polls; at 500 a micro-batch of 70,000 records is 140 of
# them. 20,000: the read, hand-over to Python and parse of 400,000 records on 2 cores took
# 4.45 s instead of 5.27 (the median of 6 alternating rounds each; 100,000 did no better).
# A read's own options override it.
MAX_POLL_RECORDS: Final = "20000"


def read_kafka(
    spark: SparkSession,
    kafka: KafkaSettings,
    *,
    stream: bool,
    group_prefix: str,
    topics: Sequence[str] | None = None,
    **options: str,
) -> DataFrame:
    """The event topic (or ``topics``) as a DataFrame with Spark's kafka-source columns, its
    consumers in groups whose ids start with ``group_prefix``."""
    reader: DataFrameReader | DataStreamReader = spark.readStream if stream else spark.read
    reader = reader.format("kafka")
    given = {
        "kafka.max.poll.records": MAX_POLL_RECORDS,
        **kafka_options(kafka, topics or [kafka.topic]),
        "groupIdPrefix": group_prefix,
    }
    for key, value in {**given, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def read_delta(
    spark: SparkSession,
    path: str,
    *,
    version: int | None = None,
    partitions: dict[str, list[str]] | None = None,
) -> DataFrame:
    """The Delta table at ``path`` (its latest version, or ``version``) as a DataFrame;
    ``partitions`` ({column: [values]}) keeps only those partitions' files."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    frame = reader.load(path)
    for column, values in (partitions or {}).items():
        frame = frame.where(frame[column].cast("string").isin(values))
    return frame


_CONFLICTS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DeltaConcurrentModificationException",
    "CommitFailedError",  # delta-rs: another process committed that version first
)


def is_commit_conflict(exc: BaseException) -> bool:
    """True when ``exc`` is delta-rs' (or delta-spark's) refusal of a commit that conflicts
    with a concurrent one (its Python class, or the Java class named in the error): rerunning
    is the remedy."""
    names = {c.__name__ for c in type(exc).__mro__}
    text = str(exc)
    return any(name in names or name in text for name in _CONFLICTS)
