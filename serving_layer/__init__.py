"""Serving layer: the batch and speed views merged per minute bucket, over Delta snapshots.

Per bucket: covered by a finished batch run → the exact batch rows, else the speed rows. See
:class:`ServingLayer` (CTR queries, freshness, view metadata) and :class:`SqlPool` (read-only
ad-hoc SQL in sandboxed DuckDB worker processes)."""
