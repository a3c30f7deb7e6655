"""A clock the test moves (``clock.now += 2.0``) instead of sleeping, for the ``clock=``
parameters (``time.monotonic`` in production) of the SQL pool, the response cache, the API."""

from __future__ import annotations


class FakeClock:
    """Seconds that stand still until the test moves them."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
