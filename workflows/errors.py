"""The one base of the errors workflows raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class WorkflowError(CtrError):
    """A procedure across layers refused: a version published before its build caught up."""
