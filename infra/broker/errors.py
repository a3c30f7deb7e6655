"""The local cluster's one error."""

from __future__ import annotations


class BrokerError(RuntimeError):
    """The local cluster could not be started or stopped; the message names the fix."""
