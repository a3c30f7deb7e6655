"""The local cluster's one error."""

from __future__ import annotations

from infra.errors import InfraError


class BrokerError(InfraError, RuntimeError):
    """The local cluster could not be started or stopped; the message names the fix."""
