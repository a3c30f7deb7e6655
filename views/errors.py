"""The one base of the errors views raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class ViewError(CtrError):
    """A view definition or a value of a view refused: an unknown version, a sketch that is not
    sealed here."""
