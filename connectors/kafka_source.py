"""A Kafka source for Spark on the Python Data Source API (streaming and batch).

It produces exactly the columns of Spark's own ``kafka`` source and takes the same options, so a
deployment with the spark-sql-kafka jar switches with ``SPARK_KAFKA_FORMAT=kafka``:

- ``kafka.bootstrap.servers`` (required), ``subscribe`` (comma-separated topics, required);
- ``startingOffsets``: ``earliest`` (streaming default is ``latest`` in Spark; here, as there,
  the caller chooses), ``latest`` or JSON ``{"topic": {"0": 42}}`` (-2 earliest, -1 latest);
- ``endingOffsets`` (batch reads): ``latest`` or JSON;
- ``maxOffsetsPerTrigger``: cap on records per micro-batch, spread over partitions by backlog;
- ``failOnDataLoss`` (default true): offsets that no longer exist are an error; when false, a
  logged skip to the earliest offset still there;
- ``kafka.*``: passed to the librdkafka consumer with the prefix removed.

Reads are by explicit offsets with ``assign()``: no consumer group; progress lives in Spark's
checkpoint. One input partition per Kafka partition range. Ends of partitions are verified by
fetching (see ``infra.offsets``), which makes AvailableNow complete on the embedded broker too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from infra.kafka_settings import KafkaSettings
from infra.offsets import offsets_consumer, partition_offsets

log = logging.getLogger("ctr.connectors.kafka")

# Spark's kafka source schema, column for column.
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
# confluent-kafka timestamp types -> Java's TimestampType ids, as Spark reports them.
_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}
_BATCH_ROWS = 20_000
# Record timestamps are whatever the producer set (CreateTime). Outside years 1-9999 they are
# null: Spark's own source fails on an overflowing one (a poison pill that stops the query for
# good) and Python tools cannot render them; -1 (no timestamp) stays 1969, as Spark reports it.
_MIN_TIMESTAMP_MS = -62_135_596_800_000  # 0001-01-01
_MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999

Offsets = dict[str, dict[str, int]]  # {"topic": {"partition": next offset}}


class DataLossError(RuntimeError):
    """Offsets the query needs are gone from Kafka (retention, or a broker that lost its log)."""


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting: str | Offsets = "earliest"
    ending: str | Offsets = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_s: float = 120.0
    max_input_partitions: int | None = None
    client_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaOptions:
        opts = {k.lower(): v for k, v in options.items()}
        servers = opts.get("kafka.bootstrap.servers")
        if not servers:
            raise ValueError("option 'kafka.bootstrap.servers' is required")
        if "assign" in opts or "subscribepattern" in opts:
            raise ValueError(
                "only the 'subscribe' option is supported (not assign/subscribePattern)"
            )
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise ValueError("option 'subscribe' must name at least one topic")
        max_offsets = opts.get("maxoffsetspertrigger")
        if max_offsets is not None and (not max_offsets.isdigit() or int(max_offsets) < 1):
            raise ValueError(
                f"option 'maxOffsetsPerTrigger' must be a positive integer: {max_offsets}"
            )
        max_parts = opts.get("maxinputpartitions")
        if max_parts is not None and (not max_parts.isdigit() or int(max_parts) < 1):
            raise ValueError(f"option 'maxInputPartitions' must be a positive integer: {max_parts}")
        fail = opts.get("failondataloss", "true").lower()
        if fail not in ("true", "false"):
            raise ValueError(f"option 'failOnDataLoss' must be true or false: {fail}")
        client = {
            k.removeprefix("kafka."): v
            for k, v in opts.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            starting=_offsets_option(opts.get("startingoffsets", "earliest"), "startingOffsets"),
            ending=_offsets_option(opts.get("endingoffsets", "latest"), "endingOffsets"),
            max_offsets_per_trigger=int(max_offsets) if max_offsets else None,
            fail_on_data_loss=fail == "true",
            poll_timeout_s=float(opts.get("kafkaconsumer.polltimeoutms", "120000")) / 1000,
            max_input_partitions=int(max_parts) if max_parts else None,
            client_config=client,
        )

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap_servers=self.bootstrap_servers, client_config=self.client_config
        )


def _offsets_option(value: str, name: str) -> str | Offsets:
    if value in ("earliest", "latest"):
        return value
    try:
        parsed = json.loads(value)
        return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(
            f"option '{name}' must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 42}}}}, got {value!r}'
        ) from None


class KafkaRange(InputPartition):
    """One Kafka partition's offsets [start, end): one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class KafkaRanges(InputPartition):
    """Several partitions' ranges read by one Spark task (option ``maxInputPartitions``)."""

    def __init__(self, ranges: list[KafkaRange]) -> None:
        super().__init__(tuple(r.value for r in ranges))
        self.ranges = ranges


def group_ranges(ranges: list[KafkaRange], most: int | None) -> list[KafkaRange | KafkaRanges]:
    """At most ``most`` input partitions, ranges balanced by size (largest first).

    Small micro-batches pay a fixed cost per Spark task (a Python worker round trip and a
    consumer connection): a low-latency job reads several small ranges per task instead.
    """
    if most is None or len(ranges) <= most:
        return list(ranges)
    bins: list[list[KafkaRange]] = [[] for _ in range(most)]
    sizes = [0] * most
    for r in sorted(ranges, key=lambda r: r.end - r.start, reverse=True):
        smallest = sizes.index(min(sizes))
        bins[smallest].append(r)
        sizes[smallest] += r.end - r.start
    return [KafkaRanges(b) for b in bins if b]


class KafkaDataSource(DataSource):
    """``spark.read[Stream].format("ctr-kafka")``: Spark's kafka source, in Python."""

    @classmethod
    def name(cls) -> str:
        return "ctr-kafka"

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader(KafkaOptions.parse(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(KafkaOptions.parse(self.options))


class _KafkaPlanner:
    """Driver-side offset arithmetic shared by the batch and the streaming reader.

    Holds one consumer for metadata and offsets (connecting costs more than the requests):
    the streaming reader keeps its planner for the life of the query.
    """

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = offsets_consumer(self.options.kafka)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def partitions_of_topics(self) -> list[tuple[str, int]]:
        metadata = self._client().list_topics(timeout=30)
        found: list[tuple[str, int]] = []
        for topic in self.options.topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                raise RuntimeError(
                    f"Kafka topic {topic!r} does not exist on {self.options.bootstrap_servers}"
                )
            found += [(topic, p) for p in sorted(info.partitions)]
        return found

    def bounds(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(earliest, verified latest) of every partition of the subscribed topics."""
        offsets = partition_offsets(
            self.options.kafka, self.partitions_of_topics(), timeout_s=30, consumer=self._client()
        )
        return {(o.topic, o.partition): (o.earliest, o.latest) for o in offsets}

    def resolve(
        self, spec: str | Offsets, bounds: dict[tuple[str, int], tuple[int, int]]
    ) -> Offsets:
        resolved: Offsets = {}
        for (topic, partition), (earliest, latest) in bounds.items():
            if spec == "earliest":
                offset = earliest
            elif spec == "latest":
                offset = latest
            else:
                assert isinstance(spec, dict)
                given = spec.get(topic, {}).get(str(partition), -2)
                offset = earliest if given == -2 else latest if given == -1 else given
            resolved.setdefault(topic, {})[str(partition)] = offset
        return resolved

    def ranges(
        self, start: Offsets, end: Offsets, bounds: dict[tuple[str, int], tuple[int, int]]
    ) -> list[KafkaRange]:
        """Input partitions for [start, end), checking that the offsets still exist."""
        ranges = []
        for topic, parts in end.items():
            for key, until in parts.items():
                partition = int(key)
                earliest = bounds.get((topic, partition), (0, until))[0]
                begin = start.get(topic, {}).get(key, earliest)  # a new partition: from its start
                if until < begin:
                    begin = self.data_loss(
                        f"{topic}[{partition}] now ends at offset {until}, but the query has "
                        f"already read up to {begin}: the broker lost records (an in-memory "
                        "broker restarted, or the topic was recreated)",
                        earliest,
                    )
                elif begin < earliest:
                    begin = self.data_loss(
                        f"{topic}[{partition}] offsets {begin}..{earliest - 1} no longer exist "
                        "(removed by retention before the query read them)",
                        earliest,
                    )
                if until > begin:
                    ranges.append(KafkaRange(topic, partition, begin, until))
        return ranges

    def data_loss(self, message: str, resume_at: int) -> int:
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{message}. Some data may have been lost. To skip it, set failOnDataLoss=false "
                "(the query continues from the earliest offset still available); to start over, "
                "use a new checkpoint."
            )
        log.warning("%s; skipping to offset %d (failOnDataLoss=false)", message, resume_at)
        return resume_at


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("ctr-kafka")``: a fixed offset range (replays, the Kappa path)."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = _KafkaPlanner(self.options)
        try:
            bounds = planner.bounds()
            start = planner.resolve(self.options.starting, bounds)
            end = planner.resolve(self.options.ending, bounds)
            return group_ranges(
                planner.ranges(start, end, bounds), self.options.max_input_partitions
            )
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("ctr-kafka")``."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self.target: Offsets | None = None  # AvailableNow: nothing past this
        self._planner: _KafkaPlanner | None = None
        # The bounds latestOffset saw: planning and progress reporting of the same batch reuse
        # them instead of asking the brokers again.
        self._bounds: dict[tuple[str, int], tuple[int, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a copy for read(): without the driver's consumer.
        return {**self.__dict__, "_planner": None, "_bounds": None}

    @property
    def planner(self) -> _KafkaPlanner:
        if self._planner is None:
            self._planner = _KafkaPlanner(self.options)
        return self._planner

    def _current_bounds(self) -> dict[tuple[str, int], tuple[int, int]]:
        if self._bounds is None:
            self._bounds = self.planner.bounds()
        return self._bounds

    def initialOffset(self) -> dict[str, Any]:
        return self.planner.resolve(self.options.starting, self.planner.bounds())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.planner.resolve("latest", self.planner.bounds())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        bounds = self._bounds = self.planner.bounds()
        latest = self.planner.resolve("latest", bounds)
        end: Offsets = {}
        backlog: dict[tuple[str, str], int] = {}
        for topic, parts in latest.items():
            for key, available in parts.items():
                until = available
                begin = start.get(topic, {}).get(key)
                if begin is None:  # a partition added since the last batch
                    begin = bounds[(topic, int(key))][0]
                if self.target is not None:
                    # AvailableNow: stop at the target; partitions born after it stay put.
                    until = min(until, self.target.get(topic, {}).get(key, begin))
                end.setdefault(topic, {})[key] = until
                if until > begin:
                    backlog[(topic, key)] = until - begin
        if isinstance(limit, ReadMaxRows) and sum(backlog.values()) > limit.max_rows:
            _cap(end, start, backlog, limit.max_rows)
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.planner.resolve("latest", self._current_bounds())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        bounds = self._current_bounds()
        if any(
            offset > bounds.get((topic, int(key)), (0, offset))[1]
            for topic, parts in end.items()
            for key, offset in parts.items()
        ):  # a replayed batch planned before this process saw the brokers
            bounds = self._bounds = self.planner.bounds()
        return group_ranges(
            self.planner.ranges(start, end, bounds), self.options.max_input_partitions
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()


def _cap(end: Offsets, start: Offsets, backlog: dict[tuple[str, str], int], limit: int) -> None:
    """Shrink ``end`` so at most ``limit`` records are read, shared by backlog size."""
    total = sum(backlog.values())
    granted = {tp: lag * limit // total for tp, lag in backlog.items()}
    spare = limit - sum(granted.values())
    for tp in sorted(backlog, key=lambda t: backlog[t] - granted[t], reverse=True):
        if spare == 0:
            break
        if granted[tp] < backlog[tp]:
            granted[tp] += 1
            spare -= 1
    for (topic, key), lag in backlog.items():
        end[topic][key] = end[topic][key] - lag + granted[(topic, key)]


def read_partition(options: KafkaOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of one Spark input partition (one range, or a group of them)."""
    if isinstance(partition, KafkaRange):
        return read_range(options, partition)
    assert isinstance(partition, KafkaRanges)
    return read_range(options, *partition.ranges)


def read_range(options: KafkaOptions, *parts: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Fetch [start, end) of each range as Arrow record batches (runs in a Spark task)."""
    for part in parts:
        # A consumer per range: a consumer reassigned to another partition may still hand out
        # records it prefetched for the previous one.
        consumer: Consumer = offsets_consumer(
            options.kafka,
            **{
                "fetch.max.bytes": 52_428_800,
                "max.partition.fetch.bytes": 10_485_760,
                "queued.min.messages": 500_000,
            },
        )
        try:
            consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
            yield from _fetch(consumer, options, part)
        finally:
            consumer.close()


def _fetch(consumer: Consumer, options: KafkaOptions, part: KafkaRange) -> Iterator[pa.RecordBatch]:
    position = part.start
    last_progress = time.monotonic()
    while position < part.end:
        # Ask for no more than the range still holds: consume() waits for num_messages (or
        # the timeout), so asking for a full batch would stall a short range for the timeout.
        wanted = max(1, min(_BATCH_ROWS, part.end - position))
        messages = consumer.consume(num_messages=wanted, timeout=1.0)
        if not messages:
            if time.monotonic() - last_progress > options.poll_timeout_s:
                raise TimeoutError(
                    f"no records from {part.topic}[{part.partition}] at offset {position} for "
                    f"{options.poll_timeout_s:.0f} s (expected up to {part.end})"
                )
            continue
        last_progress = time.monotonic()
        records = messages
        if any(m.error() for m in messages):
            records = []
            for message in messages:
                error = message.error()
                if error is None:
                    records.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    if (message.offset() or 0) >= part.end:
                        position = part.end  # what is left were control records
                elif error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                    text = (
                        f"{part.topic}[{part.partition}] offset {position} is out of range "
                        f"(expected records up to {part.end})"
                    )
                    if options.fail_on_data_loss:
                        raise DataLossError(f"{text}; set failOnDataLoss=false to skip")
                    log.warning("%s; skipping the rest of this range", text)
                    position = part.end
                else:
                    raise RuntimeError(
                        f"Kafka error reading {part.topic}[{part.partition}]: {error}"
                    )
        # One pass per column: list comprehensions are several times faster than a loop with
        # appends here, and this loop is the source's throughput.
        offsets = [m.offset() for m in records]
        if offsets and offsets[-1] >= part.end:  # type: ignore[operator]
            cut = next(i for i, o in enumerate(offsets) if o >= part.end)  # type: ignore[operator]
            records, offsets = records[:cut], offsets[:cut]
            position = part.end
        if not records:
            continue
        position = max(position, offsets[-1] + 1)  # type: ignore[operator]
        stamps = [m.timestamp() for m in records]
        yield _batch(
            part,
            [m.key() for m in records],
            [m.value() for m in records],
            offsets,  # type: ignore[arg-type]
            [s[1] for s in stamps],
            [_TIMESTAMP_TYPES.get(s[0], -1) for s in stamps],
        )


def _timestamps(millis: pa.Int64Array) -> pa.Array:
    in_range = pc.and_(
        pc.greater_equal(millis, _MIN_TIMESTAMP_MS), pc.less_equal(millis, _MAX_TIMESTAMP_MS)
    )
    kept = pc.if_else(in_range, millis, pa.scalar(None, pa.int64()))
    return kept.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))


def _batch(
    part: KafkaRange,
    keys: list[Any],
    values: list[Any],
    offsets: list[int],
    stamps: list[int],
    kinds: list[int],
) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([part.topic] * n, pa.string()),
            pa.array([part.partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            _timestamps(pa.array(stamps, pa.int64())),
            pa.array(kinds, pa.int32()),
        ],
        schema=_ARROW_SCHEMA,
    )
