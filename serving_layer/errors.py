"""The one base of the errors the serving layer raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class ServingError(CtrError):
    """A query the serving layer refuses or cannot answer: a bad parameter, a version or a
    time it does not hold, a limit reached, SQL the sandbox refuses or that failed there."""
