"""The API's own errors, under one base; :mod:`api.error_responses` maps them, and the layers'
errors, to HTTP statuses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from runtime.errors import CtrError

_QUOTED: Final = 80  # characters of an Accept header quoted back


class ApiError(CtrError):
    """The one base of the errors the API raises itself."""


class ParameterError(ApiError):
    """A request parameter is invalid: 400 naming it."""

    def __init__(self, parameter: str | None, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


class NotFoundError(ApiError):
    """What a request names does not exist, or is not the key's to see: 404 naming it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


class NotAcceptableError(ApiError):
    """The Accept header allows none of the formats: 406."""

    def __init__(self, accept: str, offered: Iterable[str]) -> None:
        quoted = accept if len(accept) <= _QUOTED else f"{accept[:_QUOTED]}… ({len(accept)} chars)"
        super().__init__(
            f"Accept: {quoted!r} allows none of {', '.join(offered)} (or use format=json|csv)"
        )


class ServerLimitError(ApiError, RuntimeError):
    """A query stopped at the server's time limit: 503 with Retry-After (its doing as much as
    the query's), the limit's message as the detail."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GateBusyError(ApiError, RuntimeError):
    """No place to compute: the queue is full, or the wait timed out."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LimitsUnavailableError(ApiError, RuntimeError):
    """The store of the limits shared by the API's replicas (``API_LIMITS_URL``) did not
    answer: a 503 with Retry-After, never a request served past a limit nobody counted."""
