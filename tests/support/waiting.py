"""Waiting for a real process (a server, a broker, a thread, a browser) to do something: the
tests' one polling loop. Its time-out bounds a process that went wrong; it is never a speed
the test expects, so it is generous."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None], *, timeout_s: float, what: str, poll_s: float = 0.05
) -> T:
    """``condition()``'s first truthy value, asked every ``poll_s`` seconds; an AssertionError
    naming ``what`` when it has none within ``timeout_s``."""
    started = time.monotonic()
    while not (value := condition()):
        waited = time.monotonic() - started
        if waited > timeout_s:
            raise AssertionError(f"timed out after {waited:.0f} s waiting until {what}")
        time.sleep(poll_s)
    return value
