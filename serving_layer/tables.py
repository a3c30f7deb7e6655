"""Moved to :mod:`serving_layer.snapshots`; kept only while ``serving_layer/sandbox/pool.py``
imports from here (it is being changed on another branch): delete once it imports
``serving_layer.snapshots``."""

from serving_layer.snapshots import LakeSnapshot, TableSnapshot

__all__ = ["LakeSnapshot", "TableSnapshot"]
