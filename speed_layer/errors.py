"""The one base of the errors speed_layer raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class SpeedError(CtrError):
    """The speed job cannot go on: its state or its tables are not the ones it left."""
