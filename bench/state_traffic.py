"""The attribution-state benchmark's input: the speed benchmark's traffic, cut once into the
micro-batches and Kafka partitions the speed job would see, so that both stores take exactly the
same events in exactly the same batches.

A micro-batch is a second of the generator's emit clock (the speed job's 1-s trigger over a
topic produced in real time); each event goes to the partition Kafka's producer would give it
(the murmur2 partitioner of the key, the impression id: ``ingest.settings``). The batches are
written as Parquet files, one per batch (``batch-NNNNNN.parquet``, modified in batch order: the
order Spark's file source takes them in), with the plan of each batch: the watermark it runs
under by the speed job's rule (the newest event time of the batches before it, less the delay,
never back) and the first open bucket that follows from it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from events.model import Event
from ingest.traffic import TrafficConfig, TrafficGenerator
from speed_layer.tasks import open_from_ms
from views.columns import DIMENSIONS

BATCH_MS: Final = 1_000  # the speed job's trigger (SPEED_TRIGGER_SECONDS' default)
START: Final = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
# Each batch file's columns: what the speed job's tasks hand the attribution (the master/events
# columns tasks.attribution_events reads), and ``newest_time``, the batch's newest event time on
# every row (the Spark side's watermark column: see bench.state_spark).
BATCH_SCHEMA: Final = pa.schema(
    [
        ("kafka_partition", pa.int32()),
        ("impression_id", pa.string()),
        ("event_type", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("newest_time", pa.timestamp("us", tz="UTC")),
        *((d, pa.string()) for d in DIMENSIONS),
    ]
)
PLAN_FILE: Final = "plan.json"
_SEED: Final = 0x9747B28C  # Kafka's murmur2
_M: Final = 0x5BD1E995


def traffic(rate: int) -> TrafficConfig:
    """The speed benchmark's traffic (seed 11, ``rate`` events per second) with the cases the
    attribution tells apart: repeated clicks (5 % of the clicks), orphan clicks (2 %), resent
    records (0.5 % of all) and late events (1 %: minutes to hours old)."""
    return TrafficConfig(
        seed=11,
        start_ms=int(START.timestamp() * 1000),
        events_per_second=rate,
        repeat_click_fraction=0.05,
        orphan_click_fraction=0.02,
        duplicate_fraction=0.005,
        late_fraction=0.01,
    )


@dataclass(frozen=True)
class BatchPlan:
    """One micro-batch: its file, its events, and the watermark it runs under."""

    batch: int
    path: str
    events: int
    newest_ms: int  # the newest event time in the batch
    watermark_ms: int  # the watermark the batch runs under (0: none yet)

    @property
    def open_from_ms(self) -> int:
        """The first open bucket under the batch's watermark (speed_layer.tasks' rule)."""
        return open_from_ms(self.watermark_ms)


def write_batches(
    folder: Path, *, batches: int, partitions: int, rate: int, watermark_ms: int
) -> list[BatchPlan]:
    """Generate ``batches`` one-second micro-batches of traffic at ``rate`` into ``folder``
    (one Parquet file each, and their plan in ``plan.json``)."""
    if batches < 2:
        raise ValueError(f"'batches' must be at least 2 (a run and a cold start), got {batches}")
    if partitions < 1:
        raise ValueError(f"'partitions' must be at least 1, got {partitions}")
    folder.mkdir(parents=True, exist_ok=True)
    generator = TrafficGenerator(traffic(rate))
    start_ms = generator.config.start_ms
    record = next(generator)
    plans: list[BatchPlan] = []
    watermark = 0
    for batch in range(batches):
        end_ms = start_ms + (batch + 1) * BATCH_MS
        rows: list[Event] = []
        while record.emit_ms < end_ms:
            if record.event is not None:
                rows.append(record.event)
            record = next(generator)
        table = batch_table(rows, partitions)
        path = folder / f"batch-{batch:06d}.parquet"
        pq.write_table(table, path)
        # Spark's file source takes the oldest file first (by modification time).
        stamp = 1_700_000_000 + batch
        os.utime(path, (stamp, stamp))
        newest = max((e.event_time for e in rows), default=0)
        plans.append(BatchPlan(batch, str(path), len(rows), newest, watermark))
        if rows:  # the speed job's rule (speed_layer.job): never back
            watermark = max(watermark, newest - watermark_ms)
    (folder / PLAN_FILE).write_text(json.dumps([asdict(p) for p in plans]))
    return plans


def read_plan(folder: Path) -> list[BatchPlan]:
    return [BatchPlan(**p) for p in json.loads((folder / PLAN_FILE).read_text())]


def batch_table(events: list[Event], partitions: int) -> pa.Table:
    """The batch's events as :data:`BATCH_SCHEMA` rows, in arrival order."""
    ids = [e.impression_id for e in events]
    times = pa.array([e.event_time * 1000 for e in events], pa.int64())
    newest = max((e.event_time for e in events), default=0) * 1000
    columns: dict[str, pa.Array] = {
        "kafka_partition": pa.array(kafka_partitions(ids, partitions), pa.int32()),
        "impression_id": pa.array(ids, pa.string()),
        "event_type": pa.array([e.event_type for e in events], pa.string()),
        "event_time": times.cast(pa.timestamp("us", tz="UTC")),
        "newest_time": pa.array(np.full(len(events), newest, np.int64)).cast(
            pa.timestamp("us", tz="UTC")
        ),
    }
    for name in DIMENSIONS:
        columns[name] = pa.array([getattr(e, name) for e in events], pa.string())
    return pa.table(columns, schema=BATCH_SCHEMA)


def kafka_partitions(keys: list[str], partitions: int) -> npt.NDArray[np.int64]:
    """The partition Kafka's murmur2 partitioner gives each key (UTF-8): the positive part of
    murmur2(key) modulo ``partitions``, as the Java client and librdkafka's murmur2 do."""
    hashes = murmur2([k.encode() for k in keys])
    return (hashes & 0x7FFFFFFF).astype(np.int64) % partitions


def murmur2(keys: list[bytes]) -> npt.NDArray[np.uint32]:
    """Kafka's murmur2 of each key (``org.apache.kafka.common.utils.Utils.murmur2``, as an
    unsigned 32-bit value), vectorised over the keys of each length."""
    out = np.zeros(len(keys), np.uint32)
    by_length: dict[int, list[int]] = {}
    for index, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(index)
    for length, indices in by_length.items():
        data = np.frombuffer(b"".join(keys[i] for i in indices), np.uint8).reshape(-1, length)
        out[indices] = _murmur2_of_length(data, length)
    return out


def _murmur2_of_length(data: npt.NDArray[np.uint8], length: int) -> npt.NDArray[np.uint32]:
    m = np.uint32(_M)
    h = np.full(len(data), (_SEED ^ length) & 0xFFFFFFFF, np.uint32)
    whole = length // 4
    if whole:
        words = np.ascontiguousarray(data[:, : whole * 4]).view("<u4")
        for i in range(whole):
            k = words[:, i].astype(np.uint32)
            k = k * m
            k ^= k >> np.uint32(24)
            k = k * m
            h = h * m
            h ^= k
    tail = length % 4
    rest = data[:, whole * 4 :].astype(np.uint32)
    if tail >= 3:
        h ^= rest[:, 2] << np.uint32(16)
    if tail >= 2:
        h ^= rest[:, 1] << np.uint32(8)
    if tail >= 1:
        h ^= rest[:, 0]
        h = h * m
    h ^= h >> np.uint32(13)
    h = h * m
    h ^= h >> np.uint32(15)
    return h
