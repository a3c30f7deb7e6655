"""Graceful stop for long-running loops: SIGINT/SIGTERM set a flag, a second one interrupts."""

from __future__ import annotations

import contextlib
import signal
from types import FrameType, TracebackType
from typing import Any, Self


class StopRequest:
    """While active, SIGINT and SIGTERM ask the loop to stop (``requested``) instead of killing
    it mid-send, so the caller can flush and report. A second signal raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for signum in (signal.SIGINT, signal.SIGTERM):
            # Outside the main thread signals stay with the caller.
            with contextlib.suppress(ValueError):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def request(self, name: str = "request") -> None:
        self.requested = True
        self.signal_name = name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.request(signal.Signals(signum).name)
