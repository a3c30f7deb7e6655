"""Serving layer: the batch and speed views merged per minute bucket, over Delta snapshots.

Per bucket: covered by a finished batch run → the exact batch rows, else the speed rows. See
:class:`ServingLayer` (CTR queries, freshness, view metadata) and :func:`run_sql` (read-only
ad-hoc SQL in a sandboxed DuckDB).
"""

from serving_layer.coverage import Coverage, CoveredInterval, Source
from serving_layer.freshness import Freshness
from serving_layer.query import GRANULARITIES, MEASURES, CtrQuery, Granularity, QueryError
from serving_layer.sandbox import SANDBOX_VIEWS, SqlError, SqlRefusedError, SqlResult, run_sql
from serving_layer.service import CtrResult, CtrRow, ServingLayer, TableInfo, ViewInfo
from serving_layer.tables import LakeSnapshot, SnapshotSource, SpeedStatus, TableSnapshot
from serving_layer.wilson import wilson_interval

__all__ = [
    "GRANULARITIES",
    "MEASURES",
    "SANDBOX_VIEWS",
    "Coverage",
    "CoveredInterval",
    "CtrQuery",
    "CtrResult",
    "CtrRow",
    "Freshness",
    "Granularity",
    "LakeSnapshot",
    "QueryError",
    "ServingLayer",
    "SnapshotSource",
    "Source",
    "SpeedStatus",
    "SqlError",
    "SqlRefusedError",
    "SqlResult",
    "TableInfo",
    "TableSnapshot",
    "ViewInfo",
    "run_sql",
    "wilson_interval",
]
