"""A background loop: one named thread that its owner starts once, stops with an Event and joins.

Every long-lived thread of the SDK follows the same rules of ownership: a name
``conductor-agents-<role>`` (the thread-leak checks look for it), an explicit ``daemon=`` with a
comment at the owner saying what is lost if it dies with the interpreter, one owner that starts,
stops (a :class:`threading.Event`) and joins it with a timeout, waits on an event rather than
``time.sleep`` (so a stop is seen at once), and a fatal error that is recorded and reported
rather than lost. :class:`BackgroundLoop` is that, once; the owner keeps what its
loop does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["BackgroundLoop", "THREAD_PREFIX"]

#: Every thread the SDK starts is named with this prefix (tests find leaked threads by it).
THREAD_PREFIX = "conductor-agents-"


class BackgroundLoop:
    """One owner's thread ``conductor-agents-<role>`` running ``body`` until it returns.

    The body is the owner's loop: it waits on :attr:`stop_event` (or on the owner's ``wake``
    event, which :meth:`stop` sets too) and returns once it is set, or when it has nothing left
    to do. A body that raises has its error kept in :attr:`error` and handed to ``on_crash``
    (called in the ``except`` clause, so ``log.exception`` there logs the traceback), and is
    raised again (``threading.excepthook`` reports it too). ``on_exit`` runs on the thread
    however the body ended.

    Args:
        role: the thread's name after ``conductor-agents-``.
        body: the loop, run once on the thread.
        daemon: whether the interpreter may exit while it runs (the owner says what is lost then).
        stop: the event :meth:`stop` sets (default: a new one); an owner that also reads its stop
            flag elsewhere passes its own.
        wake: an event :meth:`stop` sets as well, for a body that sleeps on it.

    Thread-safe: any thread may call :meth:`start`, :meth:`stop`, :meth:`join`.
    """

    def __init__(self, role: str, body: Callable[[], Any], *, daemon: bool,
                 stop: threading.Event | None = None, wake: threading.Event | None = None,
                 on_crash: Callable[[BaseException], Any] | None = None,
                 on_exit: Callable[[], Any] | None = None) -> None:
        #: The thread's name: ``conductor-agents-<role>``.
        self.name = THREAD_PREFIX + role
        self._body = body
        self.stop_event = stop if stop is not None else threading.Event()
        self._wake = wake
        self._on_crash = on_crash
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._started = False
        #: The error that ended the body, if one did.
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=daemon)

    @classmethod
    def every(cls, role: str, interval: float, step: Callable[[], Any], *, daemon: bool,
              stop: threading.Event | None = None, **kwargs: Any) -> BackgroundLoop:
        """A loop that calls ``step()`` every ``interval`` seconds until stopped, or until ``step``
        returns True (it has nothing left to do). The first call comes one interval after start."""
        stop = stop if stop is not None else threading.Event()

        def body() -> None:
            while not stop.wait(interval):
                if step():
                    return

        return cls(role, body, daemon=daemon, stop=stop, **kwargs)

    def __repr__(self) -> str:
        return f"BackgroundLoop({self.name!r}, alive={self.is_alive})"

    @property
    def is_alive(self) -> bool:
        """Whether the thread runs now (False before start and once the body returned)."""
        return self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (or the stop event set)."""
        return self.stop_event.is_set()

    def is_current(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.current_thread() is self._thread

    def start(self) -> None:
        """Start the thread.

        Raises:
            RuntimeError: it was started before.
        """
        if not self.start_once():
            raise RuntimeError(f"{self.name} can only be started once")

    def start_once(self) -> bool:
        """Start the thread unless it was started before; whether this call started it."""
        with self._lock:
            if self._started:
                return False
            self._started = True
        self._thread.start()
        return True

    def stop(self) -> None:
        """Ask the body to end: set the stop event (and ``wake``). Idempotent, safe before start."""
        self.stop_event.set()
        if self._wake is not None:
            self._wake.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end; True when it is not running.

        Returns at once before the thread started, and on the thread itself (it cannot join itself).
        """
        thread = self._thread
        if thread.ident is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        try:
            self._body()
        except BaseException as err:
            self.error = err
            if self._on_crash is not None:
                self._on_crash(err)
            raise
        finally:
            if self._on_exit is not None:
                self._on_exit()
