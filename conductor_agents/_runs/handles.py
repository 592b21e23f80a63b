"""The runtime's handle factory: an :class:`AgentHandle` with its liveness watch and the runtime's hooks.

:class:`HandleMaker` gives every handle the runtime's api, directory, observer and settings, the
watchdog's watch of its run (when it is monitored), the ``on_stall`` hook on that watch, and the
``on_pending`` hook (one ``conductor-agents-pending`` thread per process, made on first use; it looks
at every run of a continued listener that may hold a request, :func:`~.._listener.by_id.people_runs`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .._common.clock import Clock
from .._listener.by_id import people_runs
from .._listener.directory import Chain, ChainDirectory
from .._listener.following import current_runs, newer_run
from .._listener.naming import held_stall
from .._people.pending import PendingRequest
from .._people.pending_watch import PendingMonitor
from .._wire.api import ConductorApi
from .._worker.observer import TaskObserver
from .._worker.workers import WorkerSet
from ..agent import Agent
from ..errors import WorkerStallError
from ..handle import AgentHandle
from ..settings import AgentSettings

__all__ = ["HandleMaker"]


class HandleMaker:
    """Makes the handles of one process of a runtime (a forked child makes its own). Thread-safe.

    ``workers`` returns the runtime's workers *now*: a handle made before a fork then reaches the
    child's workers when its run ends or is stopped (they do not serve the parent's run: a no-op).
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, settings: AgentSettings, *, clock: Clock,
                 observer: TaskObserver, workers: Callable[[], WorkerSet],
                 on_stall: Callable[[AgentHandle, WorkerStallError], Any] | None,
                 on_pending: Callable[[AgentHandle, PendingRequest], Any] | None) -> None:
        self._api = api
        self._directory = directory
        self._settings = settings
        self._clock = clock
        self._observer = observer
        self._workers = workers
        self._on_stall = on_stall
        self._on_pending = on_pending
        self._monitor: PendingMonitor | None = None
        self._lock = threading.Lock()

    def make(self, execution_id: str, agent_name: str | None, run_id: str | None, agent: Agent | None,
             *, workers: bool, monitor: bool = True, tracker: Any = None,
             chain: Chain | None = None) -> AgentHandle:
        """A handle on run ``execution_id``; ``workers``: this process serves it; ``monitor``: watch it
        (liveness, the hooks); ``tracker``: a continued listener's watch, used instead of a new one.
        ``agent_name`` None: the handle learns it (and the run id) on first need. No request."""
        watch: Any = None
        chain = self._directory.known(execution_id) if chain is None else chain
        if monitor and run_id and self._settings.liveness_enabled:
            tree = agent is not None and agent.has_sub_runs
            # Not served here, a listener's mailbox is watched with the listener's current run, where a turn or
            # tool task waits after a message (a served listener's handle watches its runs through its tracker).
            companions = current_runs(self._directory, chain) if chain is not None and chain.mailbox else None
            # With no mailbox, the watch is of a link: when it is continued, the watch goes on in the newer one.
            successor = (newer_run(self._directory, chain) if chain is not None and chain.continuable
                         and not chain.mailbox else None)
            watch = tracker if tracker is not None else self._workers().watch(
                execution_id, domain=run_id, tree=tree, companions=companions, successor=successor)
        handle = AgentHandle(
            api=self._api, execution_id=execution_id, agent_name=agent_name, run_id=run_id,
            settings=self._settings, clock=self._clock, agent=agent, liveness=watch,
            on_terminal=self._execution_ended, on_stop=self._stop_requested, workers_attached=workers,
            observer=self._observer, directory=self._directory,
            chain=chain,
        )
        on_stall = self._on_stall
        if watch is not None and on_stall is not None:
            watch.add_listener(lambda error: on_stall(handle, held_stall(error, handle.execution_id)))
        if monitor and self._on_pending is not None and agent is not None and agent.waits_for_people:
            self._watch_pending(handle)
        return handle

    def _watch_pending(self, handle: AgentHandle) -> None:
        on_pending = self._on_pending
        assert on_pending is not None  # the caller checked: only a runtime given on_pending watches
        monitor = self._monitor
        if monitor is None or monitor.pid != os.getpid():  # first use, or first use in a forked child
            with self._lock:
                monitor = self._monitor
                if monitor is None or monitor.pid != os.getpid():
                    monitor = self._monitor = PendingMonitor(
                        self._api, on_pending,
                        interval=self._settings.pending_check_interval_seconds,
                        runs_of=lambda execution_id: people_runs(self._api, self._directory, execution_id))
        monitor.watch(handle)

    def _execution_ended(self, execution_id: str) -> None:
        self._workers().execution_ended(execution_id)

    def _stop_requested(self, execution_id: str) -> None:
        # Its tools running here see ctx.stop_requested at once.
        self._workers().stop_requested(execution_id)

    def close(self) -> None:
        """Stop this process's pending monitor (never a parent's). Idempotent."""
        monitor = self._monitor
        if monitor is not None and monitor.pid == os.getpid():
            monitor.close()
