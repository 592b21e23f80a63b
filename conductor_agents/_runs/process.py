"""The parts of one process of a runtime that start and take up its runs, made together.

:class:`ProcessRuns` is made when the runtime is, and again in a forked child (the parent's threads do not
exist there): this process's worker id, its workers (every thread they own is made on first use), its share
of serving (:class:`~.._serving.process.ProcessServing`), the handle factory, and the starter and taker the
runtime's verbs delegate to.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from .._common.clock import Clock
from .._listener.directory import ChainDirectory
from .._people.pending import PendingRequest
from .._serving.live_workers import make_worker_id
from .._serving.process import ProcessServing
from .._wire.api import ConductorApi
from .._worker.observer import TaskObserver
from .._worker.workers import WorkerSet
from ..agent import Agent
from ..errors import WorkerStallError
from ..handle import AgentHandle
from ..settings import AgentSettings
from .existing import RunTaker
from .handles import HandleMaker
from .start import RunStarter

__all__ = ["ProcessRuns"]


class ProcessRuns:
    """One process's parts of a runtime. Thread-safe as they are; :attr:`lock` guards the runtime's state.

    ``workers_now`` returns the runtime's workers *now* (a handle made before a fork reaches the
    child's); ``adopt(execution_id, agent)`` serves a run whose lease this process won; ``closing`` is
    set when the runtime closes (it ends the pauses between retries at once).
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, settings: AgentSettings, *, clock: Clock,
                 observer: TaskObserver, closing: threading.Event, workers_now: Callable[[], WorkerSet],
                 adopt: Callable[[str, Agent], AgentHandle],
                 on_stall: Callable[[AgentHandle, WorkerStallError], Any] | None,
                 on_pending: Callable[[AgentHandle, PendingRequest], Any] | None) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.worker_id = make_worker_id(uuid.uuid4().hex[:6], pid=self.pid)
        self.workers = WorkerSet(api, settings, worker_id=self.worker_id, clock=clock, observer=observer,
                                 directory=directory)
        #: Presence, leases, adoption: this process's Service, made on the first serve().
        self.serving = ProcessServing(api, settings, self.workers, worker_id=self.worker_id, adopt=adopt,
                                      pause=closing.wait)
        self.handles = HandleMaker(api, directory, settings, clock=clock, observer=observer, workers=workers_now,
                                   on_stall=on_stall, on_pending=on_pending)
        self.taker = RunTaker(api, directory, self.workers, settings, clock=clock, worker_id=self.worker_id,
                              service=self.serving.get, handle=self.handles.make)
        self.starter = RunStarter(api, directory, self.workers, settings, taker=self.taker, pause=closing.wait,
                                  handle=self.handles.make)
