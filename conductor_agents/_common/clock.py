"""Time, injectable for tests. Everything that measures durations reads a :class:`Clock`."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of time. ``monotonic`` measures durations; ``time`` is wall-clock seconds."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The real clock. Thread-safe."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()
