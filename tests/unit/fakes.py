"""Fakes shared by the unit tests: a clock that moves only when told, and waits that move it.

Nothing here opens a socket or sleeps; time passes only through :meth:`FakeClock.advance`
(or through a :class:`FakeEvent` wait, which advances the clock by the time it was asked to wait).
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional

#: Base URL used by every responses-mocked test; responses intercepts it, no socket is opened.
BASE_URL = "http://conductor.test/api"

#: A realistic wall-clock start (2023-11-14T22:13:20Z) so ``time()`` looks like epoch seconds.
WALL_START = 1_700_000_000.0


class FakeClock:
    """A :class:`conductor_agents._common.clock.Clock` that moves only when a test moves it. Thread-safe.

    ``skew`` shifts both readings (a client whose clock is off); ``auto_advance`` is added to
    the monotonic time after every ``monotonic()`` read (for loops that wait on real
    condition variables but measure their deadline on the clock).
    """

    def __init__(self, *, monotonic_start: float = 1000.0, wall_start: float = WALL_START,
                 skew: float = 0.0, auto_advance: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._elapsed = 0.0
        self._monotonic_start = monotonic_start + skew
        self._wall_start = wall_start + skew
        self.auto_advance = auto_advance

    def monotonic(self) -> float:
        with self._lock:
            value = self._monotonic_start + self._elapsed
            self._elapsed += self.auto_advance
            return value

    def time(self) -> float:
        with self._lock:
            return self._wall_start + self._elapsed

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        with self._lock:
            self._elapsed += seconds

    @property
    def elapsed(self) -> float:
        """Seconds passed since the clock was made."""
        with self._lock:
            return self._elapsed


class FakeEvent:
    """Stands in for a ``threading.Event`` that code waits on with a timeout.

    ``wait(t)`` advances the clock by ``t`` at once and returns whether the event was set;
    every requested timeout is recorded in ``waits``.
    """

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._set = False
        self.waits: List[float] = []

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.waits.append(timeout if timeout is not None else 0.0)
        if not self._set and timeout is not None:
            self._clock.advance(timeout)
        return self._set

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


class FakeWatch:
    """Stands in for a RunWatch in ``AgentHandle`` tests: a settable stall and the listeners the handle added."""

    def __init__(self, stall: Any = None) -> None:
        self.stall = stall
        self.listeners: List[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def flag(self, error: Any) -> None:
        """Set the stall and tell the listeners, as the watchdog does."""
        self.stall = error
        for listener in self.listeners:
            listener(error)


def status_body(execution_id: str, status: str, **extra: Any) -> dict:
    """A ``GET /agent/{id}/status`` body."""
    return {"executionId": execution_id, "status": status, **extra}


def count_compiles(monkeypatch: Any) -> list[str]:
    """The names of the agents whose ``Agent.to_config()`` is called from now on (the test's monkeypatch)."""
    from conductor_agents import Agent

    compiled: list[str] = []
    real = Agent.to_config

    def to_config(self: Agent) -> dict[str, Any]:
        compiled.append(self.name)
        return real(self)

    monkeypatch.setattr(Agent, "to_config", to_config)
    return compiled
