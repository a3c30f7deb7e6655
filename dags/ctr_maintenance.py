"""ctr_maintenance (an Airflow DAG): daily, delete the speed/ctr rows in intervals the batch
layer has covered (batch results supersede speed results), then compact and vacuum every Delta
table, through delta-spark in the worker (its ``SPARK_MASTER`` and ``LAKE_ROOT``, read when the
tasks run). Daily rather than scheduled on ctr_batch's assets: see dags/ctr_batch.py.
"""

from __future__ import annotations

from dags.definitions import ctr_maintenance_dag

dag = ctr_maintenance_dag()
