"""Serving layer: the batch and speed views merged per minute bucket, over Delta snapshots.

Per bucket: covered by a finished batch run → the exact batch rows, else the speed rows. See
:class:`ServingLayer` (CTR queries, freshness, view metadata) and :class:`SqlPool` (read-only
ad-hoc SQL in sandboxed DuckDB worker processes).
"""

from serving_layer.coverage import Coverage, CoveredInterval, Source
from serving_layer.freshness import Freshness
from serving_layer.json_values import jsonable
from serving_layer.query import GRANULARITIES, MEASURES, CtrQuery, Granularity, QueryError
from serving_layer.sandbox import SANDBOX_VIEWS, VIEW_NAMES, SqlError, SqlRefusedError, SqlResult
from serving_layer.service import CtrResult, CtrRow, ServingLayer, TableInfo, ViewInfo
from serving_layer.sql_pool import SandboxUnavailableError, SqlBusyError, SqlPool
from serving_layer.tables import LakeSnapshot, SnapshotSource, SpeedStatus, TableSnapshot
from serving_layer.wilson import wilson_interval

__all__ = [
    "GRANULARITIES",
    "MEASURES",
    "SANDBOX_VIEWS",
    "VIEW_NAMES",
    "Coverage",
    "CoveredInterval",
    "CtrQuery",
    "CtrResult",
    "CtrRow",
    "Freshness",
    "Granularity",
    "LakeSnapshot",
    "QueryError",
    "SandboxUnavailableError",
    "ServingLayer",
    "SnapshotSource",
    "Source",
    "SpeedStatus",
    "SqlBusyError",
    "SqlError",
    "SqlPool",
    "SqlRefusedError",
    "SqlResult",
    "TableInfo",
    "TableSnapshot",
    "ViewInfo",
    "jsonable",
    "wilson_interval",
]
