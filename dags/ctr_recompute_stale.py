"""ctr_recompute_stale (an Airflow DAG): every 10 minutes, make exact again what late events
made stale.

A cheap check (no Spark) compares ``master/arrivals`` with ``batch/coverage``; only when a covered
minute received events after the run that covered it does ``cli/submit.py --stale`` run
under spark-submit (the ``spark_default`` connection, as for ctr_batch) and recompute those hours.
Why a time schedule and not Airflow Assets, and why it is safe next to ctr_batch and backfills:
see ``ctr_recompute_stale_dag`` in dags/definitions.py. The same from a shell: ``ctr batch
--stale``.
"""

from __future__ import annotations

# Both names stay in this file: Airflow's safe mode parses only files that mention "airflow" and
# "dag" (the DAG itself is built in dags/definitions.py).
from dags.definitions import ctr_recompute_stale_dag

dag = ctr_recompute_stale_dag()
