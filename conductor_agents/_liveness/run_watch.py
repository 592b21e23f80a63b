"""What the watchdog (:mod:`.watchdog`) knows about one run, shared with the run's handles: its stall flag, who
wants to hear of a stall, and what the watchdog reads with the run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..errors import WorkerStallError
from .stall import Stall, stall_error

__all__ = ["Companions", "RunWatch", "StallListener", "Successor"]

#: Called with the stall error, from the watchdog thread.
StallListener = Callable[[WorkerStallError], None]

#: ``companions(refresh)``: the runs whose waiting tasks count as a watched run's own (:mod:`.watchdog`, *A listener's
#: mailbox*), as last known (``refresh``: the last answer's runs have ended; ask the server).
Companions = Callable[[bool], "tuple[str, ...]"]

#: ``successor()``: the run a watched run that ended goes on in (a link of a continued listener with no mailbox: its
#: newer link, once it was continued), or None (it ended for good). Called from the watchdog thread.
Successor = Callable[[], "str | None"]


class RunWatch:
    """What the watchdog knows about one run: its stall flag and who wants to hear of a stall.

    Thread-safe. Shared by the watchdog (which samples) and the run's handles (which read
    :attr:`stall` and register listeners).
    """

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.domain: str | None = None  # the run's domain when its liveness is watched
        self.served = False  # this process serves the run's tools: release them when it ends
        self.tree = False  # the run has sub-runs (sub-agents, agent tools) on its domain: sample theirs too
        self.served_domain: str | None = None  # the domain this process polls for the run's tools
        self.companions: Companions | None = None  # runs sampled with it (a mailbox's listener run)
        self.successor: Successor | None = None  # followed when the run ends (a listener's link, no mailbox)
        self.listener_id: str | None = None  # a continued listener's run: the id callers hold (its log names it)
        self._stall: WorkerStallError | None = None
        self._listeners: list[StallListener] = []
        self._lock = threading.Lock()
        self._forgotten = False  # no longer watched (ended, or the watchdog closed): never stalled again
        # Owned by the watchdog thread:
        self.first_seen: dict[str, Any] = {}
        self.due = 0.0
        self.samples = 0
        self.skipped = 0  # samples skipped because the run's queues were seen empty
        self.listed = 0  # end-of-run checks answered by its workflow's running list
        self.workflow_name: str | None = None  # the agent's name, then what a sample tells
        self.workflow_version: int | None = None
        self.name_checked = False  # the server told the workflow name (read once, at the first full sample)
        self.last_sampled = 0.0  # monotonic time of the last request for this run (set by watch())

    def __repr__(self) -> str:
        return (f"RunWatch(execution_id={self.execution_id!r}, domain={self.domain!r}, "
                f"stalled={self._stall is not None})")

    @property
    def stall(self) -> WorkerStallError | None:
        """The stall the last sample found, or None (no stall, or none any more)."""
        return self._stall

    def add_listener(self, listener: StallListener) -> None:
        """Call ``listener(error)`` each time the run becomes stalled (from the watchdog thread)."""
        with self._lock:
            self._listeners.append(listener)

    def _set_stall(self, stall: Stall | None) -> tuple[WorkerStallError, list[StallListener]] | None:
        """Record a sample's finding; when the run has just stalled, the error and the listeners to tell."""
        with self._lock:
            if stall is None or self._forgotten:
                self._stall = None
                return None
            if self._stall is not None:
                return None  # still stalled: told already
            self._stall = stall_error(self.execution_id, stall)
            return self._stall, list(self._listeners)

    def _forget(self) -> None:
        """No longer watched: the flag is cleared, and a sample still in flight (it read the run
        before its end) cannot set it again."""
        with self._lock:
            self._forgotten = True
            self._stall = None
