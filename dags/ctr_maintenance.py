"""ctr_maintenance: daily compaction and vacuum of the Delta tables, and pruning of speed/ctr
rows in intervals the batch layer has covered (batch results overwrite speed results), through
delta-spark on SPARK_MASTER."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

TABLES = ("master/events", "master/rejected", "batch/ctr", "batch/coverage", "speed/ctr")

with DAG(
    dag_id="ctr_maintenance",
    description="Compact and vacuum the lake; prune speed rows the batch layer superseded",
    schedule=os.environ.get("CTR_MAINTENANCE_SCHEDULE", "@daily"),
    start_date=datetime.fromisoformat(os.environ.get("CTR_BATCH_START_DATE", "2026-11-01T00:00Z")),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    tags=["ctr", "maintenance"],
) as dag:

    @task
    def prune_speed() -> int:
        from lake.maintenance import prune_speed
        from lake.settings import LakeSettings
        from runtime.spark import spark_session

        return prune_speed(spark_session(), LakeSettings())

    @task
    def compact_and_vacuum(table: str) -> str:
        from lake.maintenance import compact_and_vacuum
        from lake.settings import LakeSettings
        from runtime.spark import spark_session

        return str(compact_and_vacuum(spark_session(), LakeSettings(), table))

    prune_speed() >> compact_and_vacuum.expand(table=list(TABLES))
