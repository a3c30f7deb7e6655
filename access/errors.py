"""The one base of the errors access raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class AccessError(CtrError):
    """A key, a role or a scope refused: a key store that cannot be read or written, a scope that
    names nothing."""
