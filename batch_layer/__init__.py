"""The batch layer: exact views recomputed from the master dataset, interval by interval."""
