"""Runs tool bodies on a bounded thread pool and reports their results to the server.

One :class:`ToolExecutor` serves every poller of a runtime. Pollers ask for
:meth:`ToolExecutor.free_slots` before they poll and take no more tasks than that, so the
process never queues more than twice its thread count (a polled task waiting in a queue
is IN_PROGRESS on the server). Slots are not *held* during a poll: with hundreds of live
runs long-polling at once, holding them would starve every poller but the first few.
A task id already in flight is never run a second time concurrently.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .._answers.output_check import EARLIER_FAILURES_INPUT
from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._common.task_names import INTERNAL_TASK_TYPES
from .._people import approval_gate as _approval_gate
from .._teams.termination import TOKEN_USAGE_INPUT
from .._tooldefs import context as _context
from .._tooldefs import run_state as _run_state
from .._tooldefs.context import CancelReason, ToolContext
from .._tracing import hooks as tracing
from .._wire.api import ConductorApi
from .._wire.payload import ToolOutputError, tool_output
from ..errors import ServerError, ToolCancelled, ToolRetry
from ..tools import ToolArgumentsError, ToolDef
from .results import ResultPoster
from .task_watch import CancellationWatch, callback_seconds, hand_back

__all__ = ["ToolExecutor", "TaskRef"]

log = logging.getLogger("conductor_agents.worker")

_TERMINAL_FAILURE = "FAILED_WITH_TERMINAL_ERROR"
#: The status of a task handed back for another delivery (see ``task_watch.hand_back``).
_HANDED_BACK = "IN_PROGRESS"
#: Deliveries a tool call gets when the task does not say (agent tool tasks: retryCount 2).
_DEFAULT_RETRY_COUNT = 2


@attrs.frozen
class TaskRef:
    """The fields of a polled task the executor needs."""

    task_id: str
    workflow_id: str
    task_type: str
    reference_name: str
    input_data: Mapping[str, Any]
    response_timeout_seconds: float
    seq: int = 0  # the task's position in its run (an approval-required call reads the decision before it)

    @classmethod
    def from_dict(cls, task: Mapping[str, Any]) -> TaskRef:
        return cls(
            task_id=str(task["taskId"]),
            workflow_id=str(task["workflowInstanceId"]),
            task_type=str(task.get("taskType") or task.get("taskDefName") or ""),
            reference_name=str(task.get("referenceTaskName") or ""),
            input_data=dict(task.get("inputData") or {}),
            response_timeout_seconds=float(task.get("responseTimeoutSeconds") or 3600),
            seq=task["seq"] if isinstance(task.get("seq"), int) else 0,
        )


class _InFlight:
    __slots__ = (
        "body_done",
        "context",
        "last_checked",
        "last_extended",
        "max_attempts",
        "poll_count",
        "started",
        "task",
    )

    def __init__(self, task: TaskRef, now: float, raw: Mapping[str, Any], tool_name: str) -> None:
        self.task = task
        self.started = now
        self.last_extended = now
        self.last_checked = now
        self.context = ToolContext.of_task(raw, tool_name=tool_name)
        polls = raw.get("pollCount")
        self.poll_count = polls if isinstance(polls, int) else 1
        self.max_attempts = 1 + _retry_budget(raw)
        self.body_done = False  # the body returned; only its result is being posted


def _error_of(result: dict[str, Any] | None) -> str | None:
    """The text a local ``tool_finished`` event carries: the failure, or why the call was handed back."""
    if result is None:
        return "cancelled"
    if result["status"] == _HANDED_BACK:
        logs = result.get("logs") or [{}]
        return str(logs[0].get("log") or "handed back for another delivery")
    return result.get("reasonForIncompletion")


def _retry_budget(raw: Mapping[str, Any]) -> int:
    """The retries the server grants the task (its definition's ``retryCount``)."""
    for holder in (raw.get("taskDefinition"), (raw.get("workflowTask") or {}).get("taskDefinition"),
                   raw.get("workflowTask")):
        if isinstance(holder, Mapping) and isinstance(holder.get("retryCount"), int):
            count: int = holder["retryCount"]
            return max(0, count)
    return _DEFAULT_RETRY_COUNT


class ToolExecutor:
    """Executes polled tasks. Thread-safe; owned by one :class:`AgentRuntime`.

    Lifecycle: created running; :meth:`close` stops it (idempotent; a :class:`~.._common.parts.Part`). Threads:
    ``conductor-agents-tool_*`` (the pool) and ``conductor-agents-lease`` (extends the
    lease of long-running tools).
    """

    def __init__(
        self,
        api: ConductorApi,
        *,
        threads: int,
        worker_id: str,
        clock: Clock = SYSTEM_CLOCK,
        result_retry_seconds: float | None = None,
        on_task_done: Callable[[TaskRef, str, float], None] | None = None,
        task_listener: Any | None = None,  # a conductor_agents._worker.observer.TaskListener
        grace: float = 30.0,
    ) -> None:
        self._api = api
        self._grace = grace  # close()'s default: how long running tools may finish
        self._task_listener = task_listener
        self._worker_id = worker_id
        self._clock = clock
        self._results = ResultPoster(api, clock=clock, retry_seconds=result_retry_seconds)
        self._on_task_done = on_task_done
        self._threads = threads
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="conductor-agents-tool"
        )
        self._capacity = threads * 2
        self._lock = threading.Lock()
        self._in_flight: dict[str, _InFlight] = {}
        self._full = False  # no free slot: the pollers take no task
        self._last_full: float | None = None  # when it was last full (monotonic)
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._stopping: set[str] = set()  # runs asked to stop gracefully (their new tools see it too)
        self._watch = CancellationWatch(api, worker_id=worker_id)
        # Daemon: if it dies with the interpreter only lease extension is lost (the tools it
        # served die too). It exits on the stop event within one second.
        self._lease_thread = BackgroundLoop.every(
            "lease", 1.0, lambda: self._lease_tick(self._clock.monotonic()), daemon=True, stop=self._stop)
        self._lease_thread.start()

    # -- capacity ---------------------------------------------------------------------

    def free_slots(self) -> int:
        """How many more tasks this executor accepts now (running plus queued)."""
        with self._lock:
            return max(0, self._capacity - len(self._in_flight))

    def full_within(self, seconds: float) -> bool:
        """Whether the executor is full now or was within the last ``seconds`` (busy, not dead)."""
        with self._lock:
            if self._full:
                return True
            return self._last_full is not None and self._clock.monotonic() - self._last_full <= seconds

    def _note_fullness(self) -> None:
        # Called with the lock held after every change of ``_in_flight``.
        full = len(self._in_flight) >= self._capacity
        if full or self._full:
            self._last_full = self._clock.monotonic()
        self._full = full

    def runs_tools_of(self, execution_id: str, *, except_types: frozenset[str] = frozenset()) -> bool:
        """Whether a tool of ``execution_id`` (other than ``except_types``) is running or queued here."""
        with self._lock:
            return any(f.task.workflow_id == execution_id and f.task.task_type not in except_types
                       for f in self._in_flight.values())

    def in_flight_workflows(self) -> set[str]:
        """The runs whose tools are running or queued here."""
        with self._lock:
            return {f.task.workflow_id for f in self._in_flight.values()}

    def runs(self, task_id: str) -> bool:
        """Whether task ``task_id`` was handed to this executor and has not ended here (its result posted)."""
        with self._lock:
            return task_id in self._in_flight

    @property
    def in_flight_count(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # -- execution --------------------------------------------------------------------

    def submit(self, raw_task: Mapping[str, Any], tool_def: ToolDef) -> bool:
        """Run one polled task on the pool.

        Returns False when the same task is already running here (it is not run again)
        or the executor is shut down.
        """
        task = TaskRef.from_dict(raw_task)
        with self._lock:
            running = self._in_flight.get(task.task_id)
            if running is not None:
                # Delivered to us again (e.g. handed back by a resume elsewhere, then polled here):
                # the body already running is that delivery now, so the watch must not call it lost.
                polls = raw_task.get("pollCount")
                if isinstance(polls, int):
                    running.poll_count = max(running.poll_count, polls)
                log.debug("task %s is already running in this process; not run again", task.task_id)
                return False
            if self._stop.is_set():
                return False
            flight = _InFlight(task, self._clock.monotonic(), raw_task, tool_def.name)
            if task.workflow_id in self._stopping:
                flight.context.stop_requested.set()
            self._in_flight[task.task_id] = flight
            self._note_fullness()
        try:
            self._pool.submit(self._run, task, tool_def, flight)
        except RuntimeError:  # the pool was shut down between the check and here
            self._forget(task)
            return False
        return True

    def _run(self, task: TaskRef, tool_def: ToolDef, flight: _InFlight) -> None:
        started = self._clock.monotonic()
        outcome = "COMPLETED"
        listener = self._task_listener  # told when the body starts and ends (before the result is posted)
        if listener is not None:
            listener.task_started(task)
        try:
            with self._traced(task, tool_def, flight) as span:
                result = self._execute(task, tool_def, flight, span)
                span.finished(result["status"] if result is not None else None)
            flight.body_done = True
            outcome = result["status"] if result is not None else "CANCELED"
            if listener is not None:
                listener.task_finished(task, outcome, self._clock.monotonic() - started, _error_of(result))
                listener = None
            if result is not None:
                if result["status"] == _HANDED_BACK:
                    self._forget(task, flight)  # the server may deliver it again soon: it is not running here
                self._post_result(task, result)
        except BaseException:  # never let a pool thread die silently
            log.exception("unexpected error while running task %s (%s)", task.task_id, task.task_type)
            outcome = "ERROR"
        finally:
            if listener is not None:  # the body itself blew up: still balance task_started
                listener.task_finished(task, "ERROR", self._clock.monotonic() - started, "unexpected worker error")
            self._forget(task, flight)
            if self._on_task_done is not None:
                try:
                    self._on_task_done(task, outcome, self._clock.monotonic() - started)
                except Exception:
                    log.exception("task-done hook failed")

    def _forget(self, task: TaskRef, flight: _InFlight | None = None) -> None:
        """Drop the task from the in-flight set (only ``flight``'s entry, when given: after a
        hand-back the same task id may already be running again as a new delivery)."""
        with self._lock:
            if flight is None or self._in_flight.get(task.task_id) is flight:
                self._in_flight.pop(task.task_id, None)
            self._note_fullness()
            self._idle.notify_all()

    def _traced(self, task: TaskRef, tool_def: ToolDef, flight: _InFlight) -> Any:
        """The tool's ``execute_tool`` span, current while its body runs (a no-op while tracing is off)."""
        if task.task_type in INTERNAL_TASK_TYPES:
            return contextlib.nullcontext(tracing.NO_TOOL)
        return tracing.tool_call(task.workflow_id, tool_def.name, call_id=task.reference_name,
                                 attempt=flight.context.attempt, read_workflow=self._api.get_workflow)

    def _execute(self, task: TaskRef, tool_def: ToolDef, flight: _InFlight, span: Any = tracing.NO_TOOL
                 ) -> dict[str, Any] | None:
        """Run the body; the task result to post (None: post nothing, see ``_cancelled``)."""
        base = {"workflowInstanceId": task.workflow_id, "taskId": task.task_id, "workerId": self._worker_id}
        scrub = _context.secrets_of(flight.context).redact  # secrets never leave in a failure text
        try:
            if tool_def.approval_required:
                rejected = _approval_gate.rejection(self._api, execution_id=task.workflow_id, seq=task.seq,
                                                    tool_name=tool_def.name)
                if rejected is not None:
                    log.info("tool %s on task %s was not run: %s", task.task_type, task.task_id, rejected["error"])
                    return {**base, "status": "COMPLETED", "outputData": dict(rejected),
                            "reasonForIncompletion": str(rejected["error"])[:2000]}
            input_data = task.input_data
            if getattr(tool_def.func, "needs_token_usage", False):  # a Termination.token_usage check
                input_data = {**input_data, TOKEN_USAGE_INPUT: self._token_usage(task.workflow_id)}
            if getattr(tool_def.func, "needs_earlier_failures", False):  # an output_type check (read if it fails)
                input_data = {**input_data, EARLIER_FAILURES_INPUT: lambda: self._earlier_failures(task)}
            value = tool_def.invoke(input_data, context=flight.context)
        except ToolRetry as retry:
            return self._retried(task, flight, retry, base)
        except ToolCancelled as cancelled:
            return self._cancelled(task, flight, cancelled, base)
        except Exception as err:  # noqa: BLE001 - the tool's own code: the model sees the error and the run goes on
            reason = scrub(str(err) if isinstance(err, ToolArgumentsError) else f"{type(err).__name__}: {err}")
            stacktrace = scrub(traceback.format_exc())
            span.failed(err, message=reason, stacktrace=stacktrace)
            log.info("tool %s failed on task %s: %s", task.task_type, task.task_id, reason)
            return {
                **base,
                "status": _TERMINAL_FAILURE,
                "reasonForIncompletion": reason[:2000],
                "outputData": {"error": reason[:2000]},
                "logs": [{"log": stacktrace[-4000:], "createdTime": int(self._clock.time() * 1000)}],
            }
        try:
            output = _run_state.merge_updates(tool_output(value), _context.state_updates_of(flight.context))
        except ToolOutputError as err:
            reason = scrub(f"tool {task.task_type!r} returned an unusable value: {err}")
            log.warning("%s (task %s)", reason, task.task_id)
            return {**base, "status": _TERMINAL_FAILURE, "reasonForIncompletion": reason,
                    "outputData": {"error": reason}}
        return {**base, "status": "COMPLETED", "outputData": output}

    def _token_usage(self, execution_id: str) -> Mapping[str, Any]:
        """The run's token usage as the server counts it (``GET /agent/execution/{id}``).

        Raises:
            ToolRetry: it could not be read (the check is delivered again shortly).
        """
        try:
            usage = self._api.agent_execution(execution_id).get("tokenUsage")
        except ServerError as err:
            raise ToolRetry(f"could not read the run's token usage ({err})", after_seconds=2.0) from err
        return dict(usage) if isinstance(usage, Mapping) else {}

    def _earlier_failures(self, task: TaskRef) -> int:
        """How many answers the check ``task`` runs refused before in its run (its COMPLETED tasks of the
        same type whose verdict was ``passed: false``).

        Raises:
            ToolRetry: the run could not be read (the check is delivered again shortly).
        """
        try:
            tasks = self._api.get_workflow(task.workflow_id, include_tasks=True).get("tasks") or []
        except ServerError as err:
            raise ToolRetry(f"could not read the run's tasks ({err})", after_seconds=2.0) from err
        return sum(1 for t in tasks if t.get("taskType") == task.task_type and t.get("status") == "COMPLETED"
                   and t.get("taskId") != task.task_id and (t.get("outputData") or {}).get("passed") is False)

    def _retried(self, task: TaskRef, flight: _InFlight, retry: ToolRetry,
                 base: dict[str, Any]) -> dict[str, Any] | None:
        """Hand the task back for its next delivery, or fail it when its budget is spent."""
        if flight.context.cancelled.is_set():
            return self._cancelled(task, flight, None, base)
        attempt = flight.context.attempt
        retry = ToolRetry(_context.secrets_of(flight.context).redact(retry.reason), after_seconds=retry.after_seconds)
        if attempt < flight.max_attempts:
            log.info("tool %s asked for a retry on task %s (attempt %d of %d, in %gs): %s", task.task_type,
                     task.task_id, attempt, flight.max_attempts, retry.after_seconds, retry.reason)
            return {**base, "status": _HANDED_BACK, "callbackAfterSeconds": callback_seconds(retry.after_seconds),
                    "outputData": {}, "logs": [{"log": f"attempt {attempt}: ToolRetry: {retry.reason}"[:4000],
                                                "createdTime": int(self._clock.time() * 1000)}]}
        reason = f"{retry.reason} (gave up after {attempt} attempts)"
        log.info("tool %s on task %s: retry budget spent: %s", task.task_type, task.task_id, reason)
        return {**base, "status": _TERMINAL_FAILURE, "reasonForIncompletion": reason[:2000],
                "outputData": {"error": reason[:2000]}}

    def _cancelled(self, task: TaskRef, flight: _InFlight, err: ToolCancelled | None,
                   base: dict[str, Any]) -> dict[str, Any] | None:
        """What to post when a body ends with ToolCancelled.

        The run ended or another delivery owns the task: nothing (the server has moved on). The
        runtime is closing: hand the task back so whoever serves the run next runs it. The tool
        cancelled itself (nothing was cancelled): a terminal failure, so the run is not left waiting.
        """
        reason = flight.context.cancel_reason
        if reason == CancelReason.RUNTIME_CLOSING:
            return {**base, "status": _HANDED_BACK, "callbackAfterSeconds": callback_seconds(0), "outputData": {}}
        if reason is not None:
            log.info("tool %s on task %s stopped: cancelled (%s)", task.task_type, task.task_id, reason)
            return None
        text = _context.secrets_of(flight.context).redact(f"the tool cancelled itself: {err}")
        return {**base, "status": _TERMINAL_FAILURE, "reasonForIncompletion": text[:2000],
                "outputData": {"error": text[:2000]}}

    # -- cancellation -----------------------------------------------------------------

    def run_ended(self, execution_id: str) -> None:
        """The run ended (this process learnt it): cancel its running tools now."""
        with self._lock:
            self._stopping.discard(execution_id)
            flights = [f for f in self._in_flight.values() if f.task.workflow_id == execution_id]
        for flight in flights:
            _context.cancel(flight.context, CancelReason.RUN_ENDED)

    def stop_requested(self, execution_id: str) -> None:
        """A graceful stop of the run was asked: tell its running (and coming) tools."""
        with self._lock:
            self._stopping.add(execution_id)
            flights = [f for f in self._in_flight.values() if f.task.workflow_id == execution_id]
        for flight in flights:
            flight.context.stop_requested.set()

    def _post_result(self, task: TaskRef, result: dict[str, Any]) -> None:
        """POST the result until the server takes it (see :mod:`conductor_agents._worker.results`)."""
        # ``_abandon`` is set once shutdown's grace period is over: the retries stop then.
        self._results.post(task, result, self._abandon)

    # -- leases -----------------------------------------------------------------------

    def _lease_tick(self, now: float) -> None:
        """Look at long-running calls (cancellation) and extend the leases that are due."""
        with self._lock:
            flights = list(self._in_flight.values())
        try:
            self._watch.sweep(flights, now)
        except Exception:  # never let the lease thread die
            log.exception("cancellation check failed")
        # A cancelled call's lease is not extended: the server has moved on, or will.
        due = [f for f in flights if not f.context.cancelled.is_set()
               and now - f.last_extended >= max(1.0, f.task.response_timeout_seconds / 2)]
        for flight in due:
            self._extend_lease(flight, now)

    def _extend_lease(self, flight: _InFlight, now: float) -> None:
        task = flight.task
        try:
            self._api.update_task({
                "workflowInstanceId": task.workflow_id, "taskId": task.task_id, "workerId": self._worker_id,
                "status": "IN_PROGRESS", "extendLease": True, "outputData": {},
            })
            flight.last_extended = now
            log.debug("extended the lease of task %s", task.task_id)
        except ServerError as err:  # ServerUnavailableError, HttpError, a token endpoint failing
            log.warning("could not extend the lease of task %s: %s", task.task_id, err)

    # -- shutdown ---------------------------------------------------------------------

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for every running tool to finish; True when none is left."""
        deadline = self._clock.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(min(remaining, 0.5))
        return True

    def close(self, grace: float | None = None) -> None:
        """Stop taking tasks, give running tools ``grace`` seconds (default: the one it was made with), then
        stop. Idempotent.

        Running tools see ``ctx.cancelled`` set at once (reason ``runtime_closing``). A tool
        still running after the grace period has its task handed back (requeued, the run keeps
        waiting for it), so a run resumed elsewhere gets it again instead of waiting for the
        task's lease to expire. The body itself cannot be interrupted: Python joins pool
        threads at interpreter exit.
        """
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            flights = list(self._in_flight.values())
        for flight in flights:  # the tools may wrap up within the grace period
            _context.cancel(flight.context, CancelReason.RUNTIME_CLOSING)
        idle = self.wait_idle(self._grace if grace is None else grace)
        if not idle:
            with self._lock:
                left = [f.task for f in self._in_flight.values()]
            for task in left:
                log.warning("runtime closing while tool %s (task %s) still runs; handing it back so "
                            "the server delivers it again", task.task_type, task.task_id)
                try:
                    hand_back(self._api, workflow_id=task.workflow_id, task_id=task.task_id,
                              worker_id=self._worker_id, note="the worker shut down before the tool finished")
                except ServerError as err:  # ServerUnavailableError, HttpError, a token endpoint failing
                    log.error("could not hand task %s back: %s", task.task_id, err)
        self._abandon.set()
        # Idle: every pool thread is free, so joining them is quick and close() leaves no
        # thread behind. A body still running past the grace period cannot be joined.
        self._pool.shutdown(wait=idle, cancel_futures=True)
        self._lease_thread.join(timeout=2.0)
