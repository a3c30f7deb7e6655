"""Serving layer: the batch and speed views merged per minute bucket, over Delta snapshots.

Per bucket: covered by a finished batch run → the exact batch rows, else the speed rows. Split
by reader, all over one snapshot reader (:mod:`serving_layer.reader`, over the lake's pinned
versions of :mod:`serving_layer.snapshots`): the merged CTR query (:mod:`serving_layer.service`;
the query value :mod:`serving_layer.query`, its SQL :mod:`serving_layer.ctr_sql`, the serving
rule's SQL :mod:`serving_layer.merge_rule`), what the views hold
(:mod:`serving_layer.inventory`), two versions side by side (:mod:`serving_layer.diff`) and the
SQL sandbox (:mod:`serving_layer.sandbox`: read-only ad-hoc SQL in sandboxed DuckDB worker
processes)."""
