"""The watch of a listener this process serves, across its runs (its links and its mailbox): its stall, and who to
tell. What a handle needs of a run's watch (``stall``, ``add_listener``), for the whole listener."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..errors import WorkerStallError
from .directory import Chain, Link

__all__ = ["ChainTracker"]


class ChainTracker:
    """The live links of one listener served here: its stall, and who to tell. Thread-safe.

    Offers what a handle needs of a run's watch (``stall``, ``add_listener``) across links.
    """

    def __init__(self, chain: Chain, current: Link) -> None:
        self.chain = chain
        self._lock = threading.Lock()
        self._current = current
        self._watches: dict[str, Any] = {}  # execution id -> RunWatch
        self._listeners: list[Callable[[WorkerStallError], None]] = []

    @property
    def current(self) -> Link:
        with self._lock:
            return self._current

    @property
    def stall(self) -> WorkerStallError | None:
        with self._lock:
            watches = list(self._watches.values())
        for watch in watches:
            stall: WorkerStallError | None = watch.stall
            if stall is not None:
                return stall
        return None

    def add_listener(self, listener: Callable[[WorkerStallError], None]) -> None:
        with self._lock:
            self._listeners.append(listener)
            watches = list(self._watches.values())
        for watch in watches:
            watch.add_listener(listener)

    def link_added(self, link: Link, watch: Any) -> None:
        with self._lock:
            if watch is not None and link.execution_id not in self._watches:
                watch.listener_id = self.chain.execution_id  # its stall is logged by the id callers hold
                self._watches[link.execution_id] = watch
                listeners = list(self._listeners)
            else:
                listeners = []
        for listener in listeners:
            watch.add_listener(listener)

    def link_removed(self, link: Link) -> None:
        with self._lock:
            self._watches.pop(link.execution_id, None)

    def moved_to(self, link: Link) -> None:
        with self._lock:
            if link.number > self._current.number:
                self._current = link
