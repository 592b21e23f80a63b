"""The runtime's ``on_pending`` hook: tell the application when a run starts waiting for a person.

One thread per runtime (``conductor-agents-pending``) samples the runs it was given (those started
or resumed by the runtime whose agent can wait for a person: a tool needs approval, or a
:class:`~conductor_agents.HumanTool`) every ``pending_check_interval_seconds``: one
``GET /agent/{id}/status`` each, plus one task-list read when the status says the run waits on a
``HUMAN`` task (but for a listener's wait for messages on a ``HUMAN`` task, whose task is read once while it
waits). Each pending request is reported once, to ``on_pending(handle, request)``. A run
leaves the set when it ends. The thread starts with the first run and stops when none is left (or
the runtime closes), so a runtime without such runs has no thread and sends nothing.

The status names only the first task the run waits on: a :class:`HumanTool` call made in the
same turn as a wait-for-message call shows once the message has arrived.

A continued listener is watched by its first id across its runs: ``runs_of`` gives the runs that
may hold a request now (the current one, and the one before while a switch drains it), and a
request is reported once whichever run holds it. The listener is forgotten when its current run
has ended.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._common.loops import BackgroundLoop
from .._common.task_names import is_message_wait
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from ..result import RunStatus
from .pending import PendingRequest, pending_in, waits_on_person

__all__ = ["PendingMonitor", "waits_on_person"]

log = logging.getLogger("conductor_agents.pending")

PendingCallback = Callable[[Any, PendingRequest], Any]
#: The runs of a watched execution that may hold a request now, oldest first; the last is the current one.
RunsOf = Callable[[str], Sequence[str]]


class PendingMonitor:
    """Samples runs for pending requests and reports each once. Thread-safe; owned by one runtime.

    Lifecycle: the thread starts with the first :meth:`watch` and ends when no run is left;
    :meth:`close` stops and joins it and refuses new runs. Idempotent.
    """

    def __init__(self, api: ConductorApi, callback: PendingCallback, *, interval: float,
                 runs_of: RunsOf = lambda execution_id: (execution_id,)) -> None:
        self._api = api
        self._callback = callback
        self._interval = interval
        self._runs_of = runs_of
        self.pid = os.getpid()  # a forked child builds its own (this one's thread is not there)
        self._lock = threading.Lock()
        self._runs: dict[str, Any] = {}  # execution id -> handle
        self._reported: dict[str, set[str]] = {}  # execution id -> task ids already reported
        #: execution id -> {run id -> the reference of the HUMAN task the run waits in for messages}
        #: (``listener_wait="human"``), read once: such a status looks like a person's, and the run's task list
        #: need not be read again while it waits there. Only the runs of the last sample are kept.
        self._message_waits: dict[str, dict[str, str]] = {}
        self._thread: BackgroundLoop | None = None
        self._closed = False

    def watch(self, handle: Any) -> None:
        """Report the pending requests of ``handle``'s run from now on, until it ends."""
        with self._lock:
            if self._closed:
                return
            self._runs[handle.execution_id] = handle
            self._reported.setdefault(handle.execution_id, set())
            if self._thread is None or not self._thread.is_alive:
                stop = threading.Event()
                # Daemon: if the interpreter exits without close(), only on_pending calls are lost
                # (the runs go on on the server). It ends on its stop event within one interval.
                self._thread = BackgroundLoop.every("pending", self._interval, lambda: self._sample_all(stop),
                                                    daemon=True, stop=stop)
                self._thread.start()

    @property
    def watched(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._runs)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and join it (at most ``timeout``). Idempotent."""
        with self._lock:
            self._closed = True
            self._runs.clear()
            thread = self._thread
        if thread is not None:
            thread.stop()
            thread.join(timeout)

    def _sample_all(self, stop: threading.Event) -> bool:
        """One round of the thread: sample every run; True when the thread ends (stopped, or no run left)."""
        with self._lock:
            runs = list(self._runs.items())
        for execution_id, handle in runs:
            if stop.is_set():
                return True
            try:
                self.sample(execution_id, handle)
            except Exception:  # never let the thread die: a bad sample is logged and retried
                log.exception("pending check of run %s failed", execution_id)
        with self._lock:
            if not self._runs:
                self._thread = None
                return True
        return False

    def sample(self, execution_id: str, handle: Any) -> None:
        """Look at one run (each run of a continued listener that may hold a request) once; report
        what is newly pending. A read that fails leaves everything as it was until the next sample."""
        try:
            runs = list(self._runs_of(execution_id))
            statuses = [self._status(run, current=i == len(runs) - 1) for i, run in enumerate(runs)]
        except ExecutionNotFoundError:
            self._forget(execution_id)
            return
        except ConductorAgentsError as err:
            log.debug("status of %s failed: %s", execution_id, err)
            return
        if RunStatus.parse((statuses[-1] or {}).get("status")).is_terminal:
            try:
                again = list(self._runs_of(execution_id))
            except ConductorAgentsError as err:
                log.debug("runs of %s not found: %s", execution_id, err)
                return
            if again[-1:] == runs[-1:]:
                self._forget(execution_id)  # the listener ended (or the run, when it is not continued)
            return  # else a switch was committed since the runs were looked up: look again next time
        requests: list[PendingRequest] = []
        for run, status in zip(runs, statuses, strict=True):
            if status is not None and not RunStatus.parse(status.get("status")).is_terminal and \
                    waits_on_person(status) and not self._in_message_wait(execution_id, run, status):
                workflow = self._api.get_workflow(run, include_tasks=True)
                self._note_message_wait(execution_id, run, workflow)
                requests.extend(r.known_as(execution_id) for r in pending_in(workflow, run))
        with self._lock:
            waits = self._message_waits.get(execution_id)
            if waits is not None:
                self._message_waits[execution_id] = {r: ref for r, ref in waits.items() if r in runs}
            seen = self._reported.get(execution_id)
            if seen is None:
                return
            new = [r for r in requests if r.task_id not in seen]
            seen.intersection_update(r.task_id for r in requests)
            seen.update(r.task_id for r in new)
        for request in new:
            try:
                self._callback(handle, request)
            except Exception:
                log.exception("on_pending callback failed for run %s (%s); ignored", execution_id, request.kind)

    def _in_message_wait(self, execution_id: str, run: str, status: Mapping[str, Any]) -> bool:
        """Whether ``status`` names the HUMAN task ``run`` was last seen waiting in for messages."""
        pending = status.get("pendingTool")
        ref = pending.get("taskRefName") if isinstance(pending, Mapping) else None
        with self._lock:
            return ref is not None and self._message_waits.get(execution_id, {}).get(run) == ref

    def _note_message_wait(self, execution_id: str, run: str, workflow: Mapping[str, Any]) -> None:
        waits = [t for t in workflow.get("tasks") or () if isinstance(t, Mapping) and is_message_wait(t)
                 and t.get("status") == "IN_PROGRESS"]
        with self._lock:
            known = self._message_waits.setdefault(execution_id, {})
            if waits:
                known[run] = str(waits[-1].get("referenceTaskName") or "")
            else:
                known.pop(run, None)

    def _status(self, run: str, *, current: bool) -> Mapping[str, Any] | None:
        """``GET /agent/{id}/status`` of ``run``; None for an earlier run gone from the server."""
        try:
            return self._api.agent_status(run)
        except ExecutionNotFoundError:
            if current:
                raise
            return None

    def _forget(self, execution_id: str) -> None:
        with self._lock:
            self._runs.pop(execution_id, None)
            self._reported.pop(execution_id, None)
            self._message_waits.pop(execution_id, None)
