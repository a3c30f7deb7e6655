"""The one base of the errors ingest raises (:class:`runtime.errors.CtrError`)."""

from __future__ import annotations

from runtime.errors import CtrError


class IngestError(CtrError):
    """Events that cannot be sent: a topic missing."""
