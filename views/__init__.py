"""View definitions shared by the batch and the speed layer (View = Query(Data))."""

from views.ctr import CTR_COLUMNS, DIMENSIONS, ctr

__all__ = ["CTR_COLUMNS", "DIMENSIONS", "ctr"]
