"""ctr_maintenance (an Airflow DAG): daily, compact and vacuum the batch layer's Delta tables,
the view registry and the key store, through delta-rs in the worker, with no Spark (the
archiver maintains master/* and the speed job speed/ctr and speed/late, each as their only
writer) (its ``LAKE_ROOT``, read when the tasks run). Daily rather than scheduled on
ctr_batch's assets: see dags/ctr_batch.py.
"""

from __future__ import annotations

from dags.definitions import ctr_maintenance_dag

dag = ctr_maintenance_dag()
