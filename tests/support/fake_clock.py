"""Clocks the test moves instead of sleeping: :class:`FakeClock` for the ``clock=`` parameters
(``time.monotonic`` in production) of the SQL pool, the response cache and the API, and
:func:`run_in_virtual_time` for code on an event loop, whose clock is the loop's."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class FakeClock:
    """Seconds that stand still until the test moves them: ``clock.now += 2.0``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _JumpingSelector(selectors.SelectSelector):
    """Never waits for a timer: with nothing ready, its clock jumps to the next one."""

    now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(None if timeout is None else 0)
        if not ready and timeout:
            self.now += timeout
        return ready


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._selector_clock = _JumpingSelector()
        super().__init__(self._selector_clock)

    def time(self) -> float:
        return self._selector_clock.now


def run_in_virtual_time(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` (as ``asyncio.run``) on a loop whose clock stands still while any task
    can run and then jumps to the next timer: every task runs as far as it can before a
    timer fires, and sleeps and timeouts take no real time."""
    with asyncio.Runner(loop_factory=_VirtualTimeLoop) as runner:
        return runner.run(coroutine)
