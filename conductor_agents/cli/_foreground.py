"""Waiting for a run in the foreground, with Ctrl-C meaning "stop", twice meaning "cancel".

While :func:`wait_in_foreground` waits, SIGINT and SIGTERM are caught:

1. the first asks the run to stop gracefully (``handle.stop()``: it ends after the
   current turn); if it has not ended ``stop_grace`` seconds later, it is cancelled;
2. the second cancels it at once (``handle.cancel()``, TERMINATED);
3. a third gives up waiting (``KeyboardInterrupt``; the run goes on on the server).

The handlers only count and wake a helper thread; the helper makes the HTTP calls, so
a signal never interrupts a request half-way.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import ConductorAgentsError
from ..handle import AgentHandle
from ..result import AgentResult
from ._progress import ProgressDisplay

__all__ = ["wait_in_foreground"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Interrupts:
    """Counts SIGINT/SIGTERM and stops, then cancels, the run from a helper thread.

    Owned by :func:`wait_in_foreground`; the handler side (``on_signal``) runs on the
    main thread and only touches an int and an Event.
    """

    def __init__(self, handle: AgentHandle, display: ProgressDisplay, stop_grace: float) -> None:
        self._handle = handle
        self._display = display
        self._grace = stop_grace
        self._count = 0
        self._wake = threading.Event()
        self._done = threading.Event()
        self._stop_deadline: float | None = None
        self._cancelled = False
        # daemon: if the process exits while it runs, at most a stop/cancel request is lost
        # (the run then goes on on the server); wait_in_foreground joins it.
        self._thread = threading.Thread(target=self._run, name=f"conductor-agents-cli-interrupt-{handle.execution_id}",
                                        daemon=True)

    def on_signal(self, signum: int, frame: Any) -> None:
        self._count += 1
        if self._count >= 3:
            raise KeyboardInterrupt
        self._wake.set()

    def _run(self) -> None:
        handled = 0
        while not self._done.is_set():
            self._wake.wait(0.25)
            self._wake.clear()
            if self._done.is_set():
                return
            count = self._count
            if count >= 1 and handled < 1:
                handled = 1
                self._stop()
            if count >= 2 and handled < 2:
                handled = 2
                self._cancel("cancelled from the command line (second Ctrl-C)")
            if self._stop_deadline is not None and time.monotonic() > self._stop_deadline and not self._cancelled:
                self._display.event(f"the run did not stop within {self._grace:g}s; cancelling it")
                self._cancel(f"did not stop within {self._grace:g}s of a stop request")

    def _stop(self) -> None:
        self._display.event("stopping: the run ends once it has read what it was sent before (Ctrl-C again "
                            "cancels it)")
        try:
            self._handle.stop()
        except ConductorAgentsError as err:
            self._display.event(f"stop failed: {err}")
        self._stop_deadline = time.monotonic() + self._grace

    def _cancel(self, reason: str) -> None:
        self._cancelled = True
        self._display.event("cancelling the run")
        try:
            self._handle.cancel(reason)
        except ConductorAgentsError as err:
            self._display.event(f"cancel failed: {err}")

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Interrupts]:
        on_main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, self.on_signal) for sig in _SIGNALS} if on_main else {}
        self._thread.start()
        try:
            yield self
        finally:
            self._done.set()
            self._wake.set()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._thread.join(35.0)  # at most one HTTP call (30 s timeout) in flight


def wait_in_foreground(handle: AgentHandle, display: ProgressDisplay, *, timeout: float | None,
                       stop_grace: float) -> AgentResult:
    """``handle.wait(timeout)`` with Ctrl-C handling (see the module docstring).

    ``timeout`` None waits with no deadline (``math.inf``): until the run ends or Ctrl-C.
    ``run`` and ``resume`` serve a run, which may wait for messages for days; a deadline is
    only there when the caller asked for one (``--timeout``).

    Raises: as :meth:`AgentHandle.wait` (``WaitTimeoutError`` only with a ``timeout``),
    and ``KeyboardInterrupt`` on a third Ctrl-C.
    """
    interrupts = _Interrupts(handle, display, stop_grace)
    with interrupts.installed():
        return handle.wait(timeout=math.inf if timeout is None else timeout)
