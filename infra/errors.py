"""The one base of the errors infra raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class InfraError(CtrError):
    """Local infrastructure that cannot start or be reached (a broker, the object-store server,
    a browser, network namespaces); the message names the fix."""
