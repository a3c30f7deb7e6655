"""ctr_maintenance (an Airflow DAG): daily, compact and vacuum the Delta tables of the archiver
and the batch layer, through delta-spark in the worker (the speed job maintains speed/ctr and
speed/late itself, as their only writer) (its ``SPARK_MASTER`` and ``LAKE_ROOT``, read when the
tasks run). Daily rather than scheduled on ctr_batch's assets: see dags/ctr_batch.py.
"""

from __future__ import annotations

from dags.definitions import ctr_maintenance_dag

dag = ctr_maintenance_dag()
