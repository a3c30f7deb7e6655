"""The project's DAGs as functions: the DAG files next to this one (and `make demo`'s generated
one) call them with their schedule. Airflow parses this file too and finds no DAG in it.

Nothing here reads the environment, a Variable or a file when a DAG is parsed. Where Spark runs
is the `spark_default` connection (e.g. ``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark",
"host": "local[2]"}'``), and where the lake is, ``LAKE_ROOT``/``CHECKPOINT_ROOT`` of the worker:
both are read when a task runs. The connector jars and Delta's settings (``runtime.spark``) are
computed then too.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, Context, Param, task
from airflow.timetables.interval import CronDataIntervalTimetable

from lake.catalog import MAINTAINED

PROJECT: Final = Path(__file__).resolve().parents[1]
START_DATE: Final = datetime(2026, 11, 1, tzinfo=UTC)
SPARK_CONN_ID: Final = "spark_default"
# The Airflow pool every Spark task of these DAGs takes a slot of: how many Spark drivers may run
# at once, whatever the number of runs (a backfill queues dozens). infra/airflow-up.sh creates it
# with one slot per 2 cores (AIRFLOW_SPARK_SLOTS); a deployment of its own creates it once:
# `airflow pools set ctr_spark 4 "Spark drivers of ctr-lambda"`.
SPARK_POOL: Final = "ctr_spark"
# What ctr_batch writes. Named logically, not by path: the lake's location is a setting of the
# worker (LAKE_ROOT), read when the task runs, and an asset's URI is fixed when the DAG is parsed.
BATCH_CTR: Final = Asset(name="batch/ctr", uri="x-ctr-lambda://lake/batch/ctr", group="ctr-lambda")
BATCH_COVERAGE: Final = Asset(
    name="batch/coverage", uri="x-ctr-lambda://lake/batch/coverage", group="ctr-lambda"
)


class ConnectorSparkSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` with the connector jars and Delta's settings of ``runtime.spark``
    on the command line, computed when the task runs (the jar cache is the worker's), and on a
    cluster the packed Python environment its executors run (``runtime.spark.shipped``). The
    job keeps the connection's master (``spark_session(submitted=True)``)."""

    def execute(self, context: Context) -> None:
        self.configure()
        super().execute(context)

    def configure(self) -> None:
        """Complete the command line from the worker's settings (once, before submitting)."""
        from lake.settings import LakeSettings
        from runtime.spark import connector_conf, shipped
        from runtime.spark_settings import SparkSettings

        # The worker's SPARK_* settings, as `ctr batch` takes them: the connectors from its
        # jar cache, the lake's object store; the driver's and the executors' resources as
        # spark-submit flags (a running driver ignores them as conf), SPARK_CONF and dynamic
        # allocation as --conf.
        settings = SparkSettings()
        store = LakeSettings().object_store
        conf = connector_conf(store, umask=settings.umask, jar_cache=settings.jar_cache)
        self.jars = ",".join(filter(None, [conf.pop("spark.jars"), self.jars]))
        resources = settings.resources()
        self._driver_memory = self._driver_memory or settings.driver_memory
        self._executor_memory = self._executor_memory or settings.executor_memory
        self._executor_cores = self._executor_cores or settings.executor_cores
        self._num_executors = self._num_executors or settings.num_executors
        dynamic = {k: v for k, v in resources.items() if k.startswith("spark.dynamic")}
        # The connection's master decides, not SPARK_MASTER: spark-submit runs on it.
        master = str(self._get_hook()._connection["master"])
        code = shipped(settings, master)
        self.conf = {**conf, **dynamic, **code, **settings.conf, **(self.conf or {})}

    def _get_hook(self) -> SparkSubmitHook:
        """The provider's hook, its spark-submit started at the batch layer's CPU weight, in a
        session of its own (``python -m runtime.cpu_weight``: SPARK_BATCH_NICE), so that on a
        host the API shares, the API's answers come first. The process it starts is still the
        one the hook waits for and kills (the wrapper replaces itself with spark-submit)."""
        from runtime.spark_settings import SparkSettings

        hook = super()._get_hook()
        nice = SparkSettings().batch_nice  # the worker's, read when the task runs
        if nice:
            build = hook._build_spark_submit_command
            weight = [sys.executable, "-m", "runtime.cpu_weight", str(nice)]
            hook._build_spark_submit_command = lambda application: [  # type: ignore[method-assign]
                *weight,
                *build(application),
            ]
        return hook


def submit(
    task_id: str, args: list[str], *, name: str, outlets: list[Asset] | None = None
) -> ConnectorSparkSubmitOperator:
    """A task that runs ``cli/submit.py args`` under the venv's spark-submit (pyspark's, and
    its interpreter for the job) on the ``spark_default`` connection's master, in a slot of the
    :data:`SPARK_POOL` pool."""
    return ConnectorSparkSubmitOperator(
        task_id=task_id,
        conn_id=SPARK_CONN_ID,
        spark_binary=str(Path(sys.executable).with_name("spark-submit")),
        application=str(PROJECT / "cli" / "submit.py"),
        application_args=args,
        env_vars={"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(PROJECT)},
        name=name,
        outlets=outlets or [],
        pool=SPARK_POOL,
    )


def ctr_batch_dag(
    *,
    schedule: str = "0 * * * *",
    lookback_minutes: int = 120,
    start_date: datetime = START_DATE,
    catchup: bool = False,
) -> DAG:
    """``ctr_batch``: at each tick of ``schedule`` (cron, UTC), recompute the exact CTR view for
    the data interval that just ended plus ``lookback_minutes`` before it (late events), with
    ``cli/submit.py`` under spark-submit. The lookback is a DAG param: a manual run or a
    backfill may give another (``--conf '{"lookback_minutes": 360}'``).

    A run covers only the minutes the published version has settled
    (:meth:`views.definitions.Definition.settle`: 70 min for version 3, whose clicks come up to
    an hour after their impression): the rest of its interval is left to the speed layer and
    the next runs. So the lookback must be at least the settle delay, or scheduled runs never
    cover the minutes between (the default, 120 min on an hourly schedule, is)."""
    with DAG(
        dag_id="ctr_batch",
        description="Exact CTR view (batch/ctr) for each interval and its lookback",
        # Explicit data intervals, [previous tick, this tick), whatever the scheduler's
        # create_cron_data_intervals default is.
        schedule=CronDataIntervalTimetable(schedule, timezone="UTC"),
        start_date=start_date,
        catchup=catchup,
        # One run at a time, one Spark driver at a time: a backfill's runs (Airflow 3's backfill
        # has a max_active_runs of its own, 10 by default) queue behind it and the pool.
        max_active_runs=1,
        max_active_tasks=1,
        default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
        params={
            "lookback_minutes": Param(
                lookback_minutes,
                type="integer",
                minimum=0,
                description="minutes before the data interval recomputed too (late events)",
            ),
            "preview": Param(
                False,
                type="boolean",
                description="replace nothing: log what the recompute would change (a backfill "
                "with --dag-run-conf '{\"preview\": true}' previews every interval)",
            ),
        },
        tags=["ctr", "batch"],
    ) as dag:
        submit(
            "recompute_ctr",
            [
                "--start",
                "{{ (data_interval_start - macros.timedelta(minutes=params.lookback_minutes))"
                ".strftime('%Y-%m-%dT%H:%M:%SZ') }}",
                "--end",
                "{{ data_interval_end.strftime('%Y-%m-%dT%H:%M:%SZ') }}",
                "--run-id",
                "ctr-{{ run_id | replace(':', '') | replace('+', '') }}",
                "--mode",
                "{{ 'preview' if params.preview else 'replace' }}",
            ],
            name="ctr-batch",
            outlets=[BATCH_CTR, BATCH_COVERAGE],
        )
    return dag


def ctr_recompute_stale_dag(
    *, schedule: str = "*/10 * * * *", start_date: datetime = START_DATE
) -> DAG:
    """``ctr_recompute_stale``: every tick of ``schedule`` (cron, UTC), check without Spark
    whether a covered minute received events after the run that covered it (late arrivals the
    lookback of ``ctr_batch`` missed: a producer outage, a replay, an SDK flushing hours later);
    if so, recompute those hours with ``cli/submit.py --stale``, else skip.

    A time schedule, not Airflow Assets: late events come through Kafka and the streaming
    archiver, which is not an Airflow task and emits no asset events, so nothing could trigger a
    data-aware schedule; the check reads two small tables and costs well under a second. A late
    burst is exact again within one period. Safe next to ``ctr_batch`` and backfills: a Delta
    commit conflict reruns the batch job on the newer input, and runs are idempotent.
    """
    with DAG(
        dag_id="ctr_recompute_stale",
        description="Recompute the covered hours late events made stale",
        schedule=CronDataIntervalTimetable(schedule, timezone="UTC"),
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        max_active_tasks=1,
        default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
        tags=["ctr", "batch"],
    ) as dag:

        @task.short_circuit(inlets=[BATCH_COVERAGE])
        def anything_stale() -> bool:
            from lake.settings import LakeSettings
            from workflows.stale import plan

            stale = plan(LakeSettings())
            print(
                f"{stale.buckets} stale minute(s), {stale.events} late event(s), "
                f"{len(stale.intervals)} interval(s) to recompute"
            )
            return bool(stale.intervals)

        anything_stale() >> submit(
            "recompute_stale",
            ["--stale"],
            name="ctr-recompute-stale",
            outlets=[BATCH_CTR, BATCH_COVERAGE],
        )
    return dag


def ctr_reprocess_dag(*, start_date: datetime = START_DATE) -> DAG:
    """``ctr_reprocess`` (triggered by hand, with params): build a version of a view from the
    master dataset (``source``: ``master``) or from a replay of the event topic (``kafka``),
    compare it with the published version, stop for review when the diff is larger than
    ``max_changed_fraction`` of the rows, else publish it.

    ``build`` is `ctr views build [--from kafka]` under spark-submit (resumable: a rerun builds
    only what is missing); ``review`` computes the diff without Spark and skips ``publish`` when
    it is too
    large (the log shows the summary and the largest changes; publish by hand with `ctr views
    publish`, or trigger again with a larger threshold); ``publish`` switches every reader at
    once (one commit to views/registry) and is refused if the version has not caught up.
    """
    with DAG(
        dag_id="ctr_reprocess",
        description="Build, diff and publish a version of a view",
        schedule=None,
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 0},
        params={
            "view": Param("ctr", type="string", description="the view"),
            "version": Param(2, type="integer", minimum=1, description="the version to build"),
            "source": Param(
                "master",
                enum=["master", "kafka"],
                description="where history comes from: master/events, or a replay of the "
                "event topic from its earliest offset (hours before it begins are left out)",
            ),
            "max_changed_fraction": Param(
                0.05,
                type="number",
                minimum=0,
                maximum=1,
                description="publish without review up to this share of changed rows",
            ),
        },
        tags=["ctr", "batch", "views"],
    ) as dag:
        build = submit(
            "build",
            [
                "--build",
                "{{ params.view }}",
                "--version",
                "{{ params.version }}",
                "--from",
                "{{ params.source }}",
            ],
            name="ctr-reprocess-build",
        )

        @task.short_circuit
        def review(params: dict[str, object] | None = None) -> bool:
            import json

            from lake.settings import LakeSettings
            from views.definitions import definition
            from workflows.publish import review as review_version

            assert params is not None
            view, version = str(params["view"]), int(params["version"])  # type: ignore[call-overload]
            limit = float(params["max_changed_fraction"])  # type: ignore[arg-type]
            result, within = review_version(LakeSettings(), definition(view, version), limit)
            print(json.dumps(result.summary(), default=str, indent=2))
            if not within:
                print(
                    f"{result.changed_fraction:.2%} of the rows change, over the "
                    f"{limit:.2%} allowed: stopping for review. Publish by hand with "
                    f"`ctr views publish {view} {version} --reason ...`."
                )
            return within

        @task
        def publish(params: dict[str, object] | None = None, run_id: str | None = None) -> str:
            from lake.settings import LakeSettings
            from views.definitions import definition
            from workflows.publish import publish as publish_version

            assert params is not None
            view, version = str(params["view"]), int(params["version"])  # type: ignore[call-overload]
            switch = publish_version(
                LakeSettings(), definition(view, version), f"ctr_reprocess {run_id}"
            )
            if switch.event is None:
                return f"{switch.target.key} was already published"
            return f"published {switch.target.key} at {switch.event.at.isoformat()}"

        build >> review() >> publish()
    return dag


def ctr_maintenance_dag(*, schedule: str = "@daily", start_date: datetime = START_DATE) -> DAG:
    """``ctr_maintenance``: compact and vacuum the tables the batch layer writes and the view
    registry, through delta-rs in the worker (no Spark), one table after another. Its VACUUM
    is lite, and full at the day's first run (:func:`lake.maintenance.full_vacuum_due`). The
    streaming jobs' tables are not among them: the archiver and the speed job, their writers,
    compact and vacuum them."""
    with DAG(
        dag_id="ctr_maintenance",
        description="Compact and vacuum the batch tables (the streaming jobs maintain theirs)",
        schedule=schedule,
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
        tags=["ctr", "maintenance"],
    ) as dag:
        # One task for every table, through delta-rs (no Spark driver: lake.maintenance).
        @task
        def compact_and_vacuum(
            data_interval_start: datetime | None = None, data_interval_end: datetime | None = None
        ) -> list[str]:
            from lake.maintenance import compact_and_vacuum_all, full_vacuum_due
            from lake.settings import LakeSettings

            tables = [t.name for t in MAINTAINED]
            full = full_vacuum_due(data_interval_start, data_interval_end)
            reports = compact_and_vacuum_all(LakeSettings(), tables, full_vacuum=full)
            return [str(r) for r in reports]

        compact_and_vacuum()
    return dag
