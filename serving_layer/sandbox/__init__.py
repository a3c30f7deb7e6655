"""The SQL sandbox: analysts' read-only SQL over the views of one lake snapshot.

- :mod:`serving_layer.sandbox.database`: which statements may run, and a DuckDB that cannot
  write, with every view of every version (its parts: :mod:`~serving_layer.sandbox.functions`,
  the functions a query may call; :mod:`~serving_layer.sandbox.sql_tree`, what a query calls
  and reads; :mod:`~serving_layer.sandbox.arrow_files`, a table's files as Arrow datasets;
  :mod:`~serving_layer.sandbox.version_views`, the merged views per version);
- :mod:`serving_layer.sandbox.pool`: worker processes with OS limits, bounded concurrency and
  a kill at the time limit;
- :mod:`serving_layer.sandbox.backoff`: the pause of a client whose queries cost workers;
- :mod:`serving_layer.sandbox.worker`: one worker process (``python -m
  serving_layer.sandbox.worker``).
"""
