"""ctr_reprocess (an Airflow DAG, triggered by hand): build, review and publish a version of a
view. ``airflow dags trigger ctr_reprocess --conf '{"view": "ctr", "version": 2,
"max_changed_fraction": 0.05}'``; see ``ctr_reprocess_dag`` in dags/definitions.py.
"""

from __future__ import annotations

# Both names stay in this file: Airflow's safe mode parses only files that mention "airflow" and
# "dag" (the DAG itself is built in dags/definitions.py).
from dags.definitions import ctr_reprocess_dag

dag = ctr_reprocess_dag()
