"""The one base of the errors lake raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class LakeError(CtrError):
    """The lake refuses a change: a registry event that does not follow from the last."""
