"""The streaming jobs' metrics (`ctr archive`, `ctr speed`), from Spark's progress reports and
the jobs' own figures per micro-batch, labelled by ``query`` (``archiver``, ``speed``); the lag
per Kafka partition is asked of the brokers at each scrape, so a job that stopped making
progress still shows its lag growing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client.registry import Collector

from runtime.metrics import Kind, MetricSpec, metric
from runtime.streaming import StreamProgress

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from runtime.kafka_settings import KafkaSettings

log = logging.getLogger("ctr.metrics")


def _both(name: str, kind: Kind, help_text: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    """A metric both streaming jobs export, each on its own port."""
    return metric("streaming", name, kind, help_text, labels)


BATCHES: Final = _both("ctr_stream_batches", "counter", "micro-batches completed", ("query",))
RECORDS: Final = _both("ctr_stream_records", "counter", "Kafka records read", ("query",))
INVALID: Final = _both(
    "ctr_stream_invalid_records",
    "counter",
    "records that were not valid events: master/rejected (archiver), skipped and counted (speed)",
    ("query",),
)
BATCH_SECONDS: Final = _both(
    "ctr_stream_batch_duration_seconds", "histogram", "a micro-batch's duration", ("query",)
)
PHASE_SECONDS: Final = _both(
    "ctr_stream_phase_seconds",
    "counter",
    "seconds spent in each phase of the micro-batches: Spark's trigger phases (spark.*), the "
    "job's own (its commits), its tasks' summed (task.*); rate() gives each phase's share",
    ("query", "phase"),
)
INPUT_RATE: Final = _both(
    "ctr_stream_input_rows_per_second", "gauge", "the last micro-batch's input rate", ("query",)
)
PROCESSED_RATE: Final = _both(
    "ctr_stream_processed_rows_per_second",
    "gauge",
    "the last micro-batch's processing rate",
    ("query",),
)
LAST_BATCH: Final = _both(
    "ctr_stream_last_batch_timestamp_seconds",
    "gauge",
    "when the last micro-batch completed (Unix time)",
    ("query",),
)
LAG: Final = _both(
    "ctr_stream_lag_records",
    "gauge",
    "records in each Kafka partition after the offsets the last micro-batch read up to, asked "
    "of the brokers at each scrape (absent until the first micro-batch)",
    ("query", "topic", "partition"),
)
WATERMARK: Final = metric(
    "speed",
    "ctr_stream_watermark_timestamp_seconds",
    "gauge",
    "the speed job's event-time watermark (Unix time): minutes before it are closed",
    ("query",),
)
STATE_FILES_READ: Final = metric(
    "speed",
    "ctr_speed_state_files_read",
    "counter",
    "attribution state files the tasks read (a task whose partition state was not in its "
    "worker's memory: a new worker, a restart)",
)
OPEN_IMPRESSIONS: Final = metric(
    "speed",
    "ctr_speed_open_impressions",
    "gauge",
    "impressions held in the attribution state after the last micro-batch (its size)",
)
LATE_EVENTS: Final = metric(
    "speed",
    "ctr_speed_late_events",
    "counter",
    "events older than the watermark, counted in speed/late instead of speed/ctr",
)
_BUCKETS: Final = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class StreamMetrics:
    """One streaming query's metrics in ``registry``: :meth:`record` each progress report."""

    def __init__(
        self, registry: CollectorRegistry, query: str, kafka: KafkaSettings | None = None
    ) -> None:
        self.query = query
        self.batches = BATCHES.counter(registry).labels(query)
        self.records = RECORDS.counter(registry).labels(query)
        self.invalid = INVALID.counter(registry).labels(query)
        self.duration = BATCH_SECONDS.histogram(registry, _BUCKETS).labels(query)
        self.phases = PHASE_SECONDS.counter(registry)
        self.input_rate = INPUT_RATE.gauge(registry).labels(query)
        self.processed_rate = PROCESSED_RATE.gauge(registry).labels(query)
        self.last_batch = LAST_BATCH.gauge(registry).labels(query)
        self.watermark = WATERMARK.gauge(registry) if query == "speed" else None
        self.speed = (
            (
                STATE_FILES_READ.counter(registry),
                OPEN_IMPRESSIONS.gauge(registry),
                LATE_EVENTS.counter(registry),
            )
            if query == "speed"
            else None
        )
        self.lag = PartitionLag(query, kafka) if kafka is not None else None
        if self.lag is not None:
            registry.register(self.lag)

    def record(self, progress: StreamProgress) -> None:
        """Count one micro-batch's report (the job's phases in ``phases_ms``, its counts in
        ``counts``)."""
        counts = progress.counts
        self.batches.inc()
        self.records.inc(progress.input_rows)
        self.invalid.inc(counts.get("invalid", counts.get("rejected", 0)))
        self.duration.observe(progress.batch_duration_ms / 1000)
        for phase, ms in progress.phases_ms.items():
            if phase != "spark.triggerExecution":  # the whole trigger: the others' sum
                self.phases.labels(self.query, phase).inc(ms / 1000)
        self.input_rate.set(progress.input_rows_per_second)
        self.processed_rate.set(progress.processed_rows_per_second)
        self.last_batch.set(time.time())
        if self.watermark is not None and progress.watermark is not None:
            self.watermark.labels(self.query).set(progress.watermark.timestamp())
        if self.speed is not None:
            files_read, open_impressions, late = self.speed
            files_read.inc(counts.get("state_files_read", 0))
            if "open_impressions" in counts:
                open_impressions.set(counts["open_impressions"])
            late.inc(counts.get("late_events", 0))
        if self.lag is not None and progress.end_offsets:
            self.lag.end_offsets = progress.end_offsets

    def close(self) -> None:
        if self.lag is not None:
            self.lag.close()


class PartitionLag(Collector):
    """``ctr_stream_lag_records`` per partition: the brokers' latest offsets (asked at each
    scrape, with a consumer of its own) less the offsets the last micro-batch read up to."""

    def __init__(self, query: str, kafka: KafkaSettings) -> None:
        self.query = query
        self.kafka = kafka
        self.end_offsets: dict[str, dict[str, int]] | None = None
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()  # scrapes may come at once; the consumer is not shared

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        read = self.end_offsets
        if not read:
            return
        from runtime.offsets import offsets_consumer, partition_offsets

        partitions = [(t, int(p)) for t, parts in read.items() for p in parts]
        try:
            with self._lock:
                if self._consumer is None:
                    self._consumer = offsets_consumer(self.kafka)
                ends = partition_offsets(
                    self.kafka, partitions, timeout_s=5, consumer=self._consumer
                )
        except Exception as exc:  # an unreachable broker: the scrape shows the rest
            log.warning("metrics: the brokers' offsets could not be read: %s", exc)
            return
        family = LAG.family()
        for end in ends:
            behind = max(0, end.latest - read[end.topic][str(end.partition)])
            family.add_metric([self.query, end.topic, str(end.partition)], behind)
        yield family

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def served(query: str, port: int | None, host: str, kafka: KafkaSettings) -> StreamMetrics | None:
    """The job's metrics, served on ``host:port`` (None: no port, none)."""
    if port is None:
        return None
    from runtime.metrics import new_registry, serve

    registry = new_registry()
    metrics = StreamMetrics(registry, query, kafka)
    setting = "ARCHIVER_METRICS_PORT" if query == "archiver" else "SPEED_METRICS_PORT"
    serve(registry, port, host, setting)
    return metrics
