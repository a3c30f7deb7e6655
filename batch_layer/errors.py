"""The one base of the errors batch_layer raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class BatchError(CtrError):
    """A batch run that cannot start: an interval it cannot cover, a master dataset not there
    yet."""
