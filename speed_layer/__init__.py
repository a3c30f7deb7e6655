"""The speed layer: approximate CTR views of the last minutes, fresh within seconds."""

from speed_layer.job import SpeedSettings, SpeedStateError, reset, run, split_late
from speed_layer.status import read_status

__all__ = ["SpeedSettings", "SpeedStateError", "read_status", "reset", "run", "split_late"]
