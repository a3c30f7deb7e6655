"""How the jobs read Kafka and read and write Delta (Spark's kafka source, delta-spark), and
DuckDB with the Delta extension."""

from connectors.formats import kafka_options, read_delta, read_kafka, write_delta

__all__ = ["kafka_options", "read_delta", "read_kafka", "write_delta"]
