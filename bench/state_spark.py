"""Spark's own attribution state over the benchmark's micro-batches: a Structured Streaming
query in a process of its own (a fresh JVM, as a driver on a new host), its checkpoint and state
store (RocksDB, changelog checkpointing, Spark's recommendation) on the object store through
S3A.

The source is Spark's file source over the benchmark's batch files, one file per micro-batch
(``maxFilesPerTrigger=1``, oldest first): the speed job reads Kafka, but a Kafka source cannot
be told where a micro-batch ends, and the comparison needs the very micro-batches our store
took; what reading the source costs is measured apart by the baseline (below). Batches run back
to back (no trigger interval): a batch's duration is its latency, and the rate is kept when it
stays under the speed job's 1-s trigger.

Modes:

- ``pandas``: ``groupBy("impression_id").transformWithStateInPandas`` with
  :class:`bench.state_processor.PandasAttribution`, event-time timers;
- ``row``: the same with ``transformWithState`` (rows), which Spark's guide suggests for many
  keys;
- ``baseline``: the same query without the stateful operator (the clicks passed through): what
  the engine costs a micro-batch whatever the state (source, offsets and commits on the store,
  the sink's job).

The watermark column is each row's batch's newest event time (``newest_time``): Spark's
watermark is then the speed job's (the newest event time of the batches before, less the delay),
and Spark's own late-row filter (the previous batch's watermark against each row's column)
drops nothing the speed job would count; the processor drops the events of closed buckets
itself, by the speed job's rule.

The sink (``foreachBatch``) collects the operator's rows, summed per impression bucket: the
correctness check. Each batch's progress (durations, the state operator's metrics, the
watermark) is recorded by a listener. With ``--kill`` the process group is SIGKILLed once the
last batch is committed (a driver lost with its host: no graceful stop, no last snapshot); a
restart is this module again on the same checkpoint with one more file, timed from the query's
start to its first batch's end.

``python -m bench.state_spark --help`` (run by bench.state).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.streaming.listener import QueryProgressEvent

from bench.state_processor import (
    INPUT_COLUMNS,
    OUTPUT_COLUMNS,
    OUTPUT_SCHEMA,
    PandasAttribution,
    RowAttribution,
)
from bench.state_traffic import BATCH_SCHEMA
from runtime.object_store import ObjectStoreSettings
from runtime.spark import spark_session
from runtime.spark_settings import SparkSettings

MODES: Final = ("baseline", "pandas", "row")
STATE_STORE_CONF: Final = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state_spark", description=__doc__)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--input", type=Path, required=True, help="folder of batch files")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint (s3://...)")
    parser.add_argument("--batches", type=int, required=True, help="data batches to wait for")
    parser.add_argument("--partitions", type=int, required=True, help="state partitions")
    parser.add_argument("--watermark-ms", type=int, required=True)
    parser.add_argument("--window-ms", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the run's figures (JSON)")
    parser.add_argument("--log", type=Path, required=True, help="Spark's log file")
    parser.add_argument("--kill", action="store_true", help="SIGKILL the process group at the end")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    spark = _session(args.mode, args.partitions, args.log)
    session_s = time.perf_counter() - started
    recorder = Recorder()
    spark.streams.addListener(recorder)
    before = hadoop_statistics(spark)
    query_started = time.perf_counter()
    query = _query(spark, args, recorder)
    recorder.wait_for(args.batches, query)
    finished = time.perf_counter()
    after = hadoop_statistics(spark)
    result = {
        "mode": args.mode,
        "session_s": round(session_s, 3),
        "query_s": round(finished - query_started, 3),
        "first_batch_s": round(recorder.first_data_at - query_started, 3),
        "progress": recorder.progress,
        "totals": recorder.totals,
        "hadoop": {k: after.get(k, 0) - before.get(k, 0) for k in after},
        "conf": {k: _conf(spark, k) for k in _REPORTED_CONF},
    }
    args.out.write_text(json.dumps(result))
    if args.kill:
        # A driver lost with its host. Only a process that leads its own group (started as
        # one by bench.state) may do this: the group is its JVM and Python workers.
        if os.getpgid(0) != os.getpid():
            raise RuntimeError("--kill needs a process group of its own (start_new_session)")
        sys.stdout.flush()
        os.killpg(os.getpgid(0), signal.SIGKILL)
    query.stop()
    spark.stop()
    return 0


_REPORTED_CONF: Final = (
    "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot",
    "spark.sql.streaming.stateStore.maintenanceInterval",
    "spark.sql.streaming.minBatchesToRetain",
    "spark.sql.shuffle.partitions",
)


def _conf(spark: SparkSession, key: str) -> str | None:
    try:
        return spark.conf.get(key)
    except Exception:  # not set and no default: Spark raises
        return None


def _session(mode: str, partitions: int, log: Path) -> SparkSession:
    settings = SparkSettings(
        master="local[2]",
        app_name=f"bench-state-{mode}",
        shuffle_partitions=partitions,
        log_file=str(log),
        conf=STATE_STORE_CONF,
    )
    # The store of LAKE_ROOT (s3://…, set by bench.state): S3A for the checkpoint.
    return spark_session(settings, ObjectStoreSettings())


def _query(spark: SparkSession, args: argparse.Namespace, recorder: Recorder) -> StreamingQuery:
    source = (
        spark.readStream.schema(from_arrow_schema(BATCH_SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(args.input))
        .withWatermark("newest_time", f"{args.watermark_ms} milliseconds")
        .withColumn("event_ms", F.unix_millis("event_time"))
        .select(*INPUT_COLUMNS, "newest_time")
    )
    if args.mode == "baseline":
        out = source.where(F.col("event_type") == "click").select(
            (F.col("event_ms") - F.col("event_ms") % 60_000).alias("bucket_ms"),
            *[F.col(c) for c in OUTPUT_COLUMNS[1:-3]],
            F.lit(0).cast("long").alias("attributed_clicks"),
            F.lit(1).cast("long").alias("orphan_clicks"),
            F.lit(0).cast("long").alias("repeat_clicks"),
        )
    elif args.mode == "pandas":
        out = source.groupBy("impression_id").transformWithStateInPandas(
            PandasAttribution(args.window_ms), OUTPUT_SCHEMA, "Update", "EventTime"
        )
    else:
        out = source.groupBy("impression_id").transformWithState(
            RowAttribution(args.window_ms), OUTPUT_SCHEMA, "Update", "EventTime"
        )
    return (
        out.writeStream.foreachBatch(recorder.sink)
        .option("checkpointLocation", args.checkpoint)
        .queryName(f"bench-state-{args.mode}")
        .start()
    )


def hadoop_statistics(spark: SparkSession) -> dict[str, int]:
    """Hadoop's file system statistics of this JVM (every instance of a scheme's file system
    summed; local mode: the executors' too), for the object store's scheme."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    found: dict[str, int] = {}
    for stats in jvm.org.apache.hadoop.fs.FileSystem.getAllStatistics():
        if stats.getScheme() not in ("s3", "s3a"):
            continue
        for name, value in (
            ("read_ops", stats.getReadOps()),
            ("large_read_ops", stats.getLargeReadOps()),
            ("write_ops", stats.getWriteOps()),
            ("bytes_read", stats.getBytesRead()),
            ("bytes_written", stats.getBytesWritten()),
        ):
            found[name] = found.get(name, 0) + int(value)
    return found


class Recorder(StreamingQueryListener):
    """The query's progress per batch (a listener) and the sink's totals per batch."""

    def __init__(self) -> None:
        self.progress: list[dict[str, Any]] = []
        self.totals: dict[str, dict[str, list[int]]] = {}  # batch id -> bucket -> a, o, r
        self.data_batches = 0
        self.first_data_at = 0.0
        self._changed = threading.Condition()

    def sink(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow()
        totals: dict[str, list[int]] = {}
        if rows.num_rows:
            names = ("bucket_ms", "attributed_clicks", "orphan_clicks", "repeat_clicks")
            columns = [rows[c].to_pylist() for c in names]
            for bucket, *measures in zip(*columns, strict=True):
                into = totals.setdefault(str(bucket), [0, 0, 0])
                for index, value in enumerate(measures):
                    into[index] += int(value)
        self.totals[str(batch_id)] = totals

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        kept = _kept(json.loads(event.progress.json))
        self.progress.append(kept)
        with self._changed:
            if kept["file"] is not None:
                self.data_batches += 1
                if self.data_batches == 1:
                    self.first_data_at = time.perf_counter()
                if self.data_batches % 30 == 0:
                    print(
                        f"bench state_spark: {self.data_batches} batches, the last "
                        f"{kept['durationMs'].get('triggerExecution')} ms",
                        flush=True,
                    )
            self._changed.notify_all()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, batches: int, query: StreamingQuery) -> None:
        """Until ``batches`` batches with data have been committed (or the query failed)."""
        with self._changed:
            while self.data_batches < batches:
                if not query.isActive:
                    raise RuntimeError(f"the query stopped: {query.exception()}")
                self._changed.wait(timeout=5)


_OPERATOR_METRICS: Final = (
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "commitTimeMs",
    "memoryUsedBytes",
    "customMetrics",
)


def _kept(progress: dict[str, Any]) -> dict[str, Any]:
    """What the benchmark reads of a batch's progress, and the batch file it took (``file``:
    the file source's log offset, one file per batch; None: a batch without data). Spark's
    ``numInputRows`` says 0 for the first batch of a foreachBatch sink: not a guide."""
    operators = progress.get("stateOperators") or []
    [source] = progress.get("sources") or [{}]
    start, end = (_log_offset(source.get(k)) for k in ("startOffset", "endOffset"))
    return {
        "batchId": progress.get("batchId"),
        "file": end if end is not None and end != start else None,
        "numInputRows": progress.get("numInputRows"),
        "durationMs": progress.get("durationMs"),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "stateOperators": [{k: op.get(k) for k in _OPERATOR_METRICS} for op in operators],
    }


def _log_offset(offset: Any) -> int | None:
    """The file source's offset (``{"logOffset": N}``, as an object or its JSON)."""
    if isinstance(offset, str):
        offset = json.loads(offset)
    return int(offset["logOffset"]) if isinstance(offset, dict) else None


if __name__ == "__main__":
    sys.exit(main())
