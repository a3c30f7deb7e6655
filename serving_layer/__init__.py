"""Serving layer: the batch and speed views merged per minute bucket, over Delta snapshots.

Per bucket: covered by a finished batch run → the exact batch rows, else the speed rows. Split
by reader, all over one snapshot reader (:mod:`serving_layer.reader`): the merged CTR query
(:mod:`serving_layer.service`), what the views hold (:mod:`serving_layer.inventory`), two
versions side by side (:mod:`serving_layer.diff`) and the SQL sandbox
(:mod:`serving_layer.sandbox`: read-only ad-hoc SQL in sandboxed DuckDB worker processes)."""
