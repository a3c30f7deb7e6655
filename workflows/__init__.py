"""Procedures that span layers, between the entry points (the CLI, the DAGs, the spark-submit
application) and the layers: the entry points keep only their options and their printing.

- :mod:`workflows.batch`: recompute an interval, backfill hour by hour, preview a recompute;
- :mod:`workflows.stale`: find what late events made stale and recompute it;
- :mod:`workflows.build`: build a view version from master/events or from a replay of the log;
- :mod:`workflows.publish`: review a built version against the published one, publish it,
  roll back.

Each reads the view registry and ``batch/coverage`` once per call and runs the batch job
(:class:`batch_layer.job.BatchJob`) per interval; progress goes to the callbacks it is given.
"""
