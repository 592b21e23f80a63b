"""Parking the ``JOIN`` around a listener's ``HUMAN`` wait, so the server does not evaluate it while it waits.

A listener waits inside the fork of its turn's tool calls: the ``HUMAN`` wait and the ``JOIN`` after it. The server
never evaluates the ``HUMAN`` task, but it evaluates the ``JOIN``: at once for its first 200 evaluations, then at a
growing interval up to ``systemTaskWorkerCallbackDuration`` (30 s on a stock server: a wake could wait that long for
the join). The serving process *parks* the join: a task update ``IN_PROGRESS`` with ``callbackAfterSeconds``
:data:`PARK_SECONDS` postpones its next evaluation. That is safe: a join whose branch is a ``HUMAN`` wait in progress
cannot complete, so the park races nothing but the server's own write of the same state (a lost park is seen when
read back, and done again). A young join is evaluated every 50 ms, and an evaluation that ends after the park
re-queues it with the server's own delay, so a park is read back twice, a second apart, and done again until it
holds (its ``pollCount`` did not move and its ``callbackAfterSeconds`` is the park's): measured in
``benchmarks/parked_joins.py``. After the forward completed the wait, it nudges a parked join (:func:`nudge`).

:class:`JoinParker` watches the links it is told about (each model turn of a listener that waits on a ``HUMAN``
task: its next wait follows) on one thread, and parks each one's join once it waits. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ConductorAgentsError
from .handover import waiting_wait

__all__ = ["JoinParker", "PARK_SECONDS", "nudge"]

log = logging.getLogger("conductor_agents.continuation")

#: How long a park postpones a join's next evaluation. Nothing the server does for a waiting ``HUMAN`` task
#: needs the join, so a park is long; if its serving process is gone, the server takes the join up again then.
PARK_SECONDS = 3600
#: Rounds of park and read-back before a join is left at the server's own pace.
_PARK_ROUNDS = 5
#: How often a watched link is looked at, and for how long at most (a turn with slow tools).
_LOOK_EVERY = 0.25
_WATCH_SECONDS = 600.0


def _update(api: ConductorApi, join: Mapping[str, Any], callback: int, worker_id: str) -> None:
    api.update_task({"workflowInstanceId": str(join.get("workflowInstanceId")), "taskId": str(join.get("taskId")),
                     "status": "IN_PROGRESS", "callbackAfterSeconds": callback, "workerId": worker_id,
                     "outputData": dict(join.get("outputData") or {})})


def nudge(api: ConductorApi, join: Mapping[str, Any] | None, *, worker_id: str) -> bool:
    """Make a parked join due now (after its wait was completed); whether it was parked. A join not parked is left
    to the server (its own evaluation may be completing it: an update then would write over it).

    Raises: as :meth:`ConductorApi.get_task` and :meth:`ConductorApi.update_task`.
    """
    if join is None:
        return False
    now = api.get_task(str(join.get("taskId")))
    if now.get("status") != "IN_PROGRESS" or int(now.get("callbackAfterSeconds") or 0) != PARK_SECONDS:
        return False
    _update(api, now, 0, worker_id)
    return True


@attrs.define
class _Watch:
    """One watched link: until when, and its join's park under way (the read-backs are due at ``due``)."""

    until: float
    join: Mapping[str, Any] | None = None
    rounds: int = 0
    first_count: Any = None
    due: float = 0.0


class JoinParker:
    """Parks the join of each watched link's next ``HUMAN`` wait, on one thread (started on first use).

    Each watched link is looked at every :data:`_LOOK_EVERY` seconds until it waits; its join is then parked and
    read back half a second and a second and a half later (no thread sleeps for one link: the others go on)."""

    def __init__(self, api: ConductorApi, *, worker_id: str, stopping: threading.Event,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._worker_id = worker_id
        self._stopping = stopping
        self._clock = clock
        self._lock = threading.Lock()
        self._watched: dict[str, _Watch] = {}  # link execution id -> its watch
        self._wake = threading.Event()
        self._thread: BackgroundLoop | None = None
        self.parked = 0  # joins parked and held (tests, stats)

    def watch(self, execution_id: str) -> None:
        """Park the join of the next wait of link ``execution_id`` (its current one, if it waits now)."""
        with self._lock:
            known = self._watched.get(execution_id)
            if known is None or known.join is None:
                self._watched[execution_id] = _Watch(until=self._clock.monotonic() + _WATCH_SECONDS)
            if self._thread is None or not self._thread.is_alive:
                self._thread = BackgroundLoop("join-parker", self._run, daemon=True, stop=self._stopping,
                                              wake=self._wake)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                now = self._clock.monotonic()
                for gone in [e for e, w in self._watched.items() if w.until <= now]:
                    del self._watched[gone]
                due = [(e, w) for e, w in self._watched.items() if w.due <= now]
                idle = not self._watched
            if idle:
                self._wake.clear()
                self._wake.wait(30.0)
                continue
            for execution_id, watch in due:
                if self._stopping.is_set():
                    return
                try:
                    done = self._step(execution_id, watch)
                except (ConductorAgentsError, HttpError) as err:  # gone, or the server is away: its own pace
                    log.debug("run %s: parking its join failed (%s)", execution_id, err)
                    done = True
                if done:
                    with self._lock:
                        if self._watched.get(execution_id) is watch:
                            del self._watched[execution_id]
            self._stopping.wait(_LOOK_EVERY)

    def _step(self, execution_id: str, watch: _Watch) -> bool:
        """One step of link ``execution_id``'s watch; whether it is done with (its join parked, or not to be)."""
        now = self._clock.monotonic()
        if watch.join is None:
            wait, join = waiting_wait(self._api, execution_id)
            if wait is None or join is None:
                return False
            watch.join = join
            return self._park(watch, now)
        task = self._api.get_task(str(watch.join.get("taskId")))
        if task.get("status") != "IN_PROGRESS":
            return True  # the wait was answered meanwhile: nothing to park
        if watch.first_count is None:
            watch.first_count, watch.due = task.get("pollCount"), now + 1.0
            return False
        if int(task.get("callbackAfterSeconds") or 0) == PARK_SECONDS and task.get("pollCount") == watch.first_count:
            self.parked += 1
            return True
        if watch.rounds >= _PARK_ROUNDS:
            log.debug("run %s: its join is left at the server's pace (%d parks did not hold)", execution_id,
                      watch.rounds)
            return True
        return self._park(watch, now)

    def _park(self, watch: _Watch, now: float) -> bool:
        assert watch.join is not None
        _update(self._api, watch.join, PARK_SECONDS, self._worker_id)
        watch.rounds += 1
        watch.first_count, watch.due = None, now + 0.5
        return False
