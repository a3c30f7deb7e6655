"""ctr_batch: recompute the exact CTR view every hour, plus a lookback for late events.

Each run covers [data_interval_start - lookback, data_interval_end) with the batch job under
spark-submit on SPARK_MASTER. Configuration (environment of the scheduler and workers):
CTR_BATCH_SCHEDULE (cron, default hourly "0 * * * *"), CTR_BATCH_START_DATE (ISO-8601, default
2026-11-01T00:00Z), CTR_BATCH_LOOKBACK_HOURS (default 2) or CTR_BATCH_LOOKBACK_MINUTES (takes
precedence; `make demo` runs every few minutes with a short lookback), SPARK_MASTER (default
local[2]).
Backfill: airflow backfill create --dag-id ctr_batch --from-date … --to-date … --max-active-runs 1
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

PROJECT = Path(__file__).resolve().parents[1]
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")
LOOKBACK_MINUTES = int(
    os.environ.get("CTR_BATCH_LOOKBACK_MINUTES")
    or 60 * int(os.environ.get("CTR_BATCH_LOOKBACK_HOURS", "2"))
)

with DAG(
    dag_id="ctr_batch",
    description="Exact CTR view (batch/ctr) for each hour and its lookback",
    # Explicit data intervals, [previous tick, this tick), whatever the scheduler's
    # create_cron_data_intervals default is.
    schedule=CronDataIntervalTimetable(
        os.environ.get("CTR_BATCH_SCHEDULE", "0 * * * *"), timezone="UTC"
    ),
    start_date=datetime.fromisoformat(os.environ.get("CTR_BATCH_START_DATE", "2026-11-01T00:00Z")),
    catchup=True,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
    tags=["ctr", "batch"],
) as dag:
    BashOperator(
        task_id="recompute_ctr",
        bash_command=(
            # The connector jars and Delta's settings (runtime/spark.py) on the command line.
            f'"{SPARK_SUBMIT}" $("{sys.executable}" -m runtime.spark) '
            '--master "${SPARK_MASTER:-local[2]}" '
            f'"{PROJECT}/batch_layer/submit.py" '
            "--start {{ (data_interval_start - macros.timedelta(minutes=params.lookback_minutes))"
            ".strftime('%Y-%m-%dT%H:%M:%SZ') }} "
            "--end {{ data_interval_end.strftime('%Y-%m-%dT%H:%M:%SZ') }} "
            "--run-id \"ctr-{{ run_id | replace(':', '') | replace('+', '') }}\""
        ),
        params={"lookback_minutes": LOOKBACK_MINUTES},
        env={"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(PROJECT)},
        append_env=True,
        cwd=str(PROJECT),
    )
