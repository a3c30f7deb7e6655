"""The speed benchmark's last part, in its own SparkSession: the view's Spark job taken apart
on VIEW_RECORDS records of the topic, and the view's rows written both ways.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from runtime.kafka_settings import KafkaSettings
from runtime.spark_settings import SparkSettings

VIEW_RECORDS = 2_000  # the in-process breakdown of the view's Spark job


def view_breakdown(kafka: KafkaSettings, work: Path) -> dict[str, float]:
    """The view's Spark job on VIEW_RECORDS records of the topic, taken apart: the Kafka read
    alone, + parsing and validation, + the view (as a Spark aggregation to Arrow, and as the
    job computes it: the events to Arrow, the view on the driver, with reach's sketches; and the
    view on the driver alone, with and without them); then the view's rows written to a
    scratch speed table both ways measured: a delta-spark append with txnAppId/txnVersion (the
    cheapest delta-spark commit) and the job's delta-rs append. Median of 5 rounds, ms."""
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from events.records import parse_records
    from lake.catalog import SPEED_CTR
    from lake.settings import LakeSettings
    from runtime.connectors import SPEED_GROUP, read_kafka
    from runtime.offsets import topic_offsets
    from runtime.spark import spark_session
    from speed_layer.attribution import INCREMENTS_SCHEMA
    from speed_layer.tables import SpeedTable
    from speed_layer.tasks import with_attribution
    from views.columns import DIMENSIONS
    from views.ctr import ctr, ctr_arrow

    # The scratch tables are under work: a local lake's (no object store in use).
    store = LakeSettings(lake_root=work).object_store
    spark = spark_session(SparkSettings(), store)
    parts = topic_offsets(kafka, kafka.topic)
    each = max(1, VIEW_RECORDS // len(parts))
    starting = {kafka.topic: {str(p.partition): p.earliest for p in parts}}
    ending = {kafka.topic: {str(p.partition): min(p.latest, p.earliest + each) for p in parts}}

    def raw() -> DataFrame:  # a new plan per run: Spark would skip a stage it has run before
        return read_kafka(spark, kafka, stream=False, group_prefix=SPEED_GROUP,
                          startingOffsets=json.dumps(starting),
                          endingOffsets=json.dumps(ending))  # fmt: skip

    def valid() -> DataFrame:
        return parse_records(raw()).where(F.col("reason").isNull())

    def spark_view() -> pa.Table:  # the view as a Spark aggregation (the job's, before)
        return valid().select("event_time", "event_type", *DIMENSIONS).transform(ctr).toArrow()

    def view() -> pa.Table:  # the job's: the events to the driver, the view of them there
        return ctr_arrow(valid().toArrow(), reach=True)

    # The view on the driver alone, with and without reach's sketches (the job's since reach).
    events = valid().toArrow()
    rows = with_attribution(view(), INCREMENTS_SCHEMA.empty_table())
    rows = rows.append_column(
        "updated_at", pa.array([time.time_ns() // 1000] * rows.num_rows, pa.timestamp("us", "UTC"))
    )
    spark_path, rs_table = (
        str(work / "spark-append"),
        SpeedTable(str(work / "rs-append"), store, SPEED_CTR.schema, retention_hours=48),
    )
    version = iter(range(1_000))
    steps: dict[str, Callable[[], object]] = {
        "kafka_read": lambda: raw().agg(F.sum(F.length("value"))).collect(),
        "read_and_parse": lambda: valid().agg(F.count(F.lit(1))).collect(),
        "read_parse_spark_view": spark_view,
        "read_parse_view": view,
        "driver_view_without_reach": lambda: ctr_arrow(events),
        "driver_view_with_reach": lambda: ctr_arrow(events, reach=True),
        "delta_spark_append": lambda: (
            spark.createDataFrame(rows)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", "bench")
            .option("txnVersion", str(next(version)))
            .save(spark_path)
        ),
        "delta_rs_append": lambda: rs_table.append(rows, app_id="bench", version=next(version)),
    }
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(6):  # interleaved, the first round a warm-up
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            if round_:
                runs[name].append((time.perf_counter() - started) * 1000)
    timings = {name: round(statistics.median(values), 1) for name, values in runs.items()}
    timings["view_rows"] = rows.num_rows
    return timings
