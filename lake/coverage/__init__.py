"""Coverage, in one place: which minutes the batch layer made exact, and which of those late
events made stale.

- :mod:`lake.coverage.model`: the values, pure: a run's row, the runs, their union per view
  version as intervals, gaps, what one coverage holds and another does not, provenance.
- :mod:`lake.coverage.log`: the one reader and writer of ``batch/coverage``.
- :mod:`lake.coverage.staleness`: the staleness rule (SQL over the arrivals, the runs and the
  batch rows), and the stale buckets and the intervals that make them exact again.
"""
