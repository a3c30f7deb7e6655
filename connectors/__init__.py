"""Spark connectors: a Kafka source and a Delta sink on the Python Data Source API, and the
helpers that pick them or the JVM connectors by configuration."""

from connectors.delta_sink import DeltaDataSource, ReplaceWhereViolation
from connectors.formats import kafka_options, read_delta, read_kafka, write_delta
from connectors.kafka_source import KAFKA_SCHEMA, DataLossError, KafkaDataSource

__all__ = [
    "KAFKA_SCHEMA",
    "DataLossError",
    "DeltaDataSource",
    "KafkaDataSource",
    "ReplaceWhereViolation",
    "kafka_options",
    "read_delta",
    "read_kafka",
    "write_delta",
]
