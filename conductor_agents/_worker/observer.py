"""Watches this process's workers: counts, timings, and local events for subscribers.

One :class:`TaskObserver` per runtime (created by the :class:`~conductor_agents._worker.workers.WorkerSet`).
The tool executor tells it when a tool body starts and finishes (:class:`TaskListener`);
the pollers' API is wrapped so every poll is counted and the pickup latency of each
polled task is sampled. Event streams subscribe per execution id and receive
:class:`~conductor_agents.events.ToolStartedEvent` / ``ToolFinishedEvent`` for that run.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.fork import rebuild_after_fork
from .._common.task_names import INTERNAL_TASK_TYPES
from ..errors import ConductorAgentsError, RuntimeClosedError
from ..events import AgentEvent, ToolFinishedEvent, ToolStartedEvent
from ..stats import WINDOW, LatencySummary, RunInfo, RunStats, RuntimeStats

if TYPE_CHECKING:
    from .executor import TaskRef
    from .poller import DomainPoller

__all__ = ["TaskListener", "TaskObserver"]

log = logging.getLogger("conductor_agents.events")

#: Per-run counters kept for runs that ended (oldest idle ones are forgotten first).
_MAX_RUNS = 1024

Subscriber = Callable[[AgentEvent], None]


class TaskListener(Protocol):
    """What the tool executor reports. Called on pool threads; implementations must not raise."""

    def task_started(self, task: TaskRef) -> None: ...

    def task_finished(self, task: TaskRef, status: str, seconds: float, error: str | None) -> None: ...


class _Counters:
    __slots__ = ("durations", "executed", "failed", "in_flight", "pickups")

    def __init__(self, window: int) -> None:
        self.executed = 0
        self.failed = 0
        self.in_flight = 0
        self.durations: collections.deque[float] = collections.deque(maxlen=window)
        self.pickups: collections.deque[float] = collections.deque(maxlen=window)


class _PollCountingApi:
    """Delegates to a ConductorApi; counts ``poll_tasks`` calls and samples pickup latency."""

    def __init__(self, api: Any, observer: TaskObserver) -> None:
        self._api = api
        self._observer = observer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def poll_tasks(self, task_type: str, **kwargs: Any) -> list[dict[str, Any]]:
        try:
            tasks: list[dict[str, Any]] = self._api.poll_tasks(task_type, **kwargs)
        except ConductorAgentsError:
            self._observer.poll_failed()
            raise
        self._observer.polled(tasks)
        return tasks


class TaskObserver:
    """Counts and timings of tool work, and per-run fan-out of local events. Thread-safe.

    Lifecycle: created with its runtime; :meth:`close` (idempotent) closes every event
    stream still registered, so none outlives the runtime. In a forked child it starts
    again from zero (counts, subscribers and streams are the parent's), keeping only
    whether it is closed: a child's stats are of the tools the child ran.
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, window: int = WINDOW) -> None:
        self._clock = clock
        self._window = window
        self._closed = False
        self._reset()
        rebuild_after_fork(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._total = _Counters(self._window)
        self._runs: collections.OrderedDict[str, _Counters] = collections.OrderedDict()
        self._aliases: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._subscribers: dict[str, list[Subscriber]] = {}
        self._streams: set[Any] = set()
        self._polls = 0
        self._poll_errors = 0

    def _after_fork_in_child(self) -> None:
        self._reset()

    # -- wiring -----------------------------------------------------------------------

    def polling_api(self, api: Any) -> Any:
        """``api`` with its polls counted (give this to the pollers)."""
        return _PollCountingApi(api, self)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- TaskListener -----------------------------------------------------------------

    def alias(self, execution_id: str, as_execution_id: str) -> None:
        """Count the tools of run ``execution_id`` as ``as_execution_id``'s (a continued listener's
        later runs count as the listener's first)."""
        if execution_id == as_execution_id:
            return
        with self._lock:
            self._aliases[execution_id] = as_execution_id
            while len(self._aliases) > _MAX_RUNS:
                self._aliases.popitem(last=False)

    def task_started(self, task: TaskRef) -> None:
        """A tool body starts on a pool thread."""
        if task.task_type in INTERNAL_TASK_TYPES:
            return
        try:
            with self._lock:
                self._total.in_flight += 1
                self._run(task.workflow_id).in_flight += 1
            self._publish(task.workflow_id, ToolStartedEvent(
                execution_id=task.workflow_id, id=f"local:{task.task_id}:tool_started",
                timestamp=self._clock.time(), tool_name=task.task_type, task_id=task.task_id,
                task_reference_name=task.reference_name))
        except Exception:  # never disturb the tool
            log.exception("recording the start of task %s failed", task.task_id)

    def task_finished(self, task: TaskRef, status: str, seconds: float, error: str | None) -> None:
        """A tool body returned or raised after ``seconds``; ``status`` goes to the server."""
        if task.task_type in INTERNAL_TASK_TYPES:
            return
        try:
            failed = status != "COMPLETED"
            with self._lock:
                for counters in (self._total, self._run(task.workflow_id)):
                    counters.in_flight = max(0, counters.in_flight - 1)
                    counters.executed += 1
                    counters.failed += int(failed)
                    counters.durations.append(max(0.0, seconds))
            self._publish(task.workflow_id, ToolFinishedEvent(
                execution_id=task.workflow_id, id=f"local:{task.task_id}:tool_finished",
                timestamp=self._clock.time(), tool_name=task.task_type, task_id=task.task_id,
                task_reference_name=task.reference_name, status=status, duration_seconds=max(0.0, seconds),
                error=error))
        except Exception:
            log.exception("recording the end of task %s failed", task.task_id)

    # -- polls ------------------------------------------------------------------------

    def polled(self, tasks: Iterable[Mapping[str, Any]]) -> None:
        """A poll succeeded; sample each task's ``startTime - scheduledTime`` (server clock)."""
        samples = []
        for task in tasks or ():
            if task.get("taskType") in INTERNAL_TASK_TYPES:
                continue
            scheduled, started = task.get("scheduledTime"), task.get("startTime")
            if isinstance(scheduled, (int, float)) and isinstance(started, (int, float)) and scheduled > 0 \
                    and started > 0:
                samples.append((str(task.get("workflowInstanceId") or ""), max(0.0, (started - scheduled) / 1000.0)))
        with self._lock:
            self._polls += 1
            for execution_id, latency in samples:
                self._total.pickups.append(latency)
                self._run(execution_id).pickups.append(latency)

    def poll_failed(self) -> None:
        with self._lock:
            self._polls += 1
            self._poll_errors += 1

    # -- subscriptions ----------------------------------------------------------------

    def subscribe(self, execution_id: str, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber`` with every local event of ``execution_id``; returns the unsubscribe function."""
        with self._lock:
            self._subscribers.setdefault(execution_id, []).append(subscriber)

        def unsubscribe() -> None:
            with self._lock:
                subscribers = self._subscribers.get(execution_id, [])
                if subscriber in subscribers:
                    subscribers.remove(subscriber)
                if not subscribers:
                    self._subscribers.pop(execution_id, None)

        return unsubscribe

    def _publish(self, execution_id: str, event: AgentEvent) -> None:
        with self._lock:
            subscribers = list(self._subscribers.get(execution_id, ()))
        for subscriber in subscribers:
            try:
                subscriber(event)
            except Exception:
                log.exception("an event subscriber failed")

    def register_stream(self, stream: Any) -> None:
        """Track an open event stream so :meth:`close` can close it.

        Raises:
            RuntimeClosedError: the runtime is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeClosedError("this AgentRuntime is closed")
            self._streams.add(stream)

    def unregister_stream(self, stream: Any) -> None:
        with self._lock:
            self._streams.discard(stream)

    def close(self) -> None:
        """Close every registered event stream. Idempotent."""
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams), set()
        for stream in streams:
            stream.close()

    # -- snapshots --------------------------------------------------------------------

    def run_stats(self, execution_id: str, domain: str | None = None) -> RunStats:
        """This process's counts and timings for one run (zeros when it ran nothing here)."""
        with self._lock:
            counters = self._runs.get(execution_id)
            if counters is None:
                return RunStats(execution_id=execution_id, domain=domain)
            return RunStats(
                execution_id=execution_id, domain=domain, tools_executed=counters.executed,
                tools_failed=counters.failed, tools_in_flight=counters.in_flight,
                tool_duration=LatencySummary.of(list(counters.durations)),
                pickup_latency=LatencySummary.of(list(counters.pickups)),
            )

    def runtime_stats(self, pollers: Iterable[DomainPoller] = ()) -> RuntimeStats:
        """Totals across runs; ``pollers`` name the active runs and their domains."""
        runs = tuple(sorted((RunInfo(execution_id=e, domain=p.domain) for p in pollers for e in p.executions),
                            key=lambda r: (r.domain or "", r.execution_id)))
        with self._lock:
            return RuntimeStats(
                tools_executed=self._total.executed, tools_failed=self._total.failed,
                tools_in_flight=self._total.in_flight,
                tool_duration=LatencySummary.of(list(self._total.durations)),
                pickup_latency=LatencySummary.of(list(self._total.pickups)),
                active_runs=runs, polls=self._polls, poll_errors=self._poll_errors,
            )

    def _run(self, execution_id: str) -> _Counters:
        """The counters of one run (call with the lock held)."""
        execution_id = self._aliases.get(execution_id, execution_id)
        counters = self._runs.get(execution_id)
        if counters is None:
            counters = self._runs[execution_id] = _Counters(self._window)
            if len(self._runs) > _MAX_RUNS:
                for old_id, old in list(self._runs.items()):
                    if old.in_flight == 0 and old_id != execution_id:
                        del self._runs[old_id]
                        break
        else:
            self._runs.move_to_end(execution_id)
        return counters
