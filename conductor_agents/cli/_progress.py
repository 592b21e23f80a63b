"""Progress of a run on standard error: a redrawn status line on a terminal, plain lines otherwise.

:class:`RunWatcher` follows the run on a background thread and turns what happens into
lines: model turns, "waiting for a message", tool calls and their results, errors, the
end. It reads :meth:`AgentHandle.events` (the server's event stream, or the task list
when the stream is unavailable); given only a ``fetch`` function it samples the task list
itself (:class:`TaskTracker`). :class:`ServedWatch` says when no process serves the run.
:class:`ProgressDisplay` writes the lines: on a TTY a spinner line at the bottom is redrawn
in place and event lines scroll above it; on anything else (a pipe, a file, CI logs) each
event is one plain line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from .._common.task_names import MESSAGE_WAIT_TASK_TYPE, MODEL_TASK_TYPE, is_message_wait
from .._liveness.model_calls import says_model_unavailable
from .._serving.served import unserved_line
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from ..result import SERVER_INPUT_KEYS, RunStatus, is_control_message

__all__ = ["ProgressDisplay", "RunWatcher", "ServedWatch", "TaskTracker", "describe_event"]

log = logging.getLogger("conductor_agents.cli")

_SPINNER = "|/-\\"
_WAIT_TASK_TYPE = MESSAGE_WAIT_TASK_TYPE
_LLM_TASK_TYPE = MODEL_TASK_TYPE
#: Task types that are the agent loop's machinery, never shown.
_MACHINERY = frozenset({
    "INLINE", "SET_VARIABLE", "DO_WHILE", "SWITCH", "FORK", "FORK_JOIN_DYNAMIC", "JOIN", "DYNAMIC",
    "SUB_WORKFLOW", "TERMINATE", "EXCLUSIVE_JOIN", "JSON_JQ_TRANSFORM",
})
_TERMINAL_TASK = frozenset({
    "COMPLETED", "COMPLETED_WITH_ERRORS", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "CANCELED", "TIMED_OUT", "SKIPPED",
})
_MAX_TEXT = 100


def short(value: Any, limit: int = _MAX_TEXT) -> str:
    """``value`` as compact JSON (or text), cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProgressDisplay:
    """Writes progress lines to ``stream`` (default stderr). Thread-safe.

    ``tty`` (default: ``stream.isatty()``) selects the redrawn status line with a spinner
    (turned by a ticker thread between :meth:`start` and :meth:`close`); without it,
    :meth:`set_status` prints nothing and only :meth:`event` lines appear.
    """

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self._stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self._lock = threading.RLock()
        self._status = ""
        self._frame = 0
        self._drawn = False
        self._started = time.monotonic()
        self._closing = threading.Event()
        self._ticker: threading.Thread | None = None

    def start(self) -> ProgressDisplay:
        """Start turning the spinner (TTY only). Idempotent."""
        with self._lock:
            if self.tty and self._ticker is None:
                # daemon: if it died with the process only the spinner would stop; close() joins it.
                self._ticker = threading.Thread(target=self._tick_loop, name="conductor-agents-cli-spinner",
                                                daemon=True)
                self._ticker.start()
        return self

    def event(self, text: str) -> None:
        """Print one event line (above the status line on a TTY)."""
        with self._lock:
            self._clear()
            self._write(text + "\n")
            self._draw()

    def set_status(self, text: str) -> None:
        """Replace the status line's text (TTY only)."""
        with self._lock:
            self._status = text
            self._draw()

    def close(self) -> None:
        """Stop the spinner and erase the status line. Idempotent."""
        self._closing.set()
        ticker = self._ticker
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join(2.0)
        with self._lock:
            self._clear()
            self._status = ""

    def _tick_loop(self) -> None:
        while not self._closing.wait(0.1):
            with self._lock:
                self._frame += 1
                self._draw()

    def _draw(self) -> None:
        if not self.tty or not self._status or self._closing.is_set():
            return
        elapsed = time.monotonic() - self._started
        line = f"{_SPINNER[self._frame % len(_SPINNER)]} {self._status} [{elapsed:.0f}s]"
        self._write("\r\x1b[2K" + line)
        self._drawn = True

    def _clear(self) -> None:
        if self.tty and self._drawn:
            self._write("\r\x1b[2K")
            self._drawn = False

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # a closed pipe must not break the run
            pass


class TaskTracker:
    """Turns successive snapshots of a workflow into progress lines. Not thread-safe (one watcher owns it)."""

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.status: str | None = None
        self._seen: dict[str, str] = {}  # task id -> last status reported
        self._turns = 0
        self.activity = ""

    def update(self, workflow: Mapping[str, Any]) -> list[str]:
        """The lines describing what changed since the previous snapshot."""
        lines: list[str] = []
        for task in workflow.get("tasks") or []:
            lines.extend(self._task_lines(task))
        status = str(workflow.get("status") or "")
        if status and status != self.status:
            self.status = status
            lines.append(f"run {status}")
        if RunStatus.parse(status).is_terminal:
            self.activity = status
        return lines

    def _task_lines(self, task: Mapping[str, Any]) -> list[str]:
        task_type = str(task.get("taskType") or "")
        if task_type in _MACHINERY:
            return []
        task_id = str(task.get("taskId") or task.get("referenceTaskName") or "")
        status = str(task.get("status") or "")
        previous = self._seen.get(task_id)
        if previous == status:
            return []
        self._seen[task_id] = status
        terminal = status in _TERMINAL_TASK
        if task_type == _LLM_TASK_TYPE:
            if previous is None:
                self._turns += 1
                self.activity = f"model turn {self._turns}"
                return [f"model turn {self._turns}"]
            return [f"model turn {self._turns} {status}"] if status not in ("COMPLETED", "IN_PROGRESS") else []
        name = str(task.get("taskDefName") or task_type)
        if is_message_wait(task):
            return self._wait_lines(name, task, status, terminal, previous)
        if not terminal:
            self.activity = f"running {name}"
            return []
        args = {k: v for k, v in (task.get("inputData") or {}).items() if k not in SERVER_INPUT_KEYS}
        call = f"{name}({', '.join(f'{k}={short(v, 40)}' for k, v in args.items())})"
        if status == "COMPLETED":
            return [f"tool {call} -> {short(task.get('outputData') or {})}"]
        reason = task.get("reasonForIncompletion") or ""
        return [f"tool {call} {status}{': ' + short(reason) if reason else ''}"]

    def _wait_lines(self, name: str, task: Mapping[str, Any], status: str, terminal: bool,
                    previous: str | None) -> list[str]:
        if not terminal:
            self.activity = "waiting for a message"
            return [f"{name}: waiting for a message"] if previous is None else []
        if status != "COMPLETED":
            return [f"{name} {status}"]
        messages = (task.get("outputData") or {}).get("messages") or []
        payloads = [p for p in (m.get("payload") if isinstance(m, Mapping) else m for m in messages)
                    if not is_control_message(p)]  # the SDK's own (the stop signal) is no sender's message
        return [f"{name}: received {short(p)}" for p in payloads] or [f"{name}: no message"]


def describe_event(event: Any, turns: list[Any]) -> tuple[list[str], str | None]:
    """The lines and the new status-line text (None: unchanged) for one :class:`AgentEvent`.

    ``turns`` counts model turns, updated in place: ``[count]``, then ``[count, last turn's reference name]``.
    """
    kind = getattr(event, "kind", "")
    name = getattr(event, "tool_name", "") or ""
    if kind == "thinking":
        ref = getattr(event, "task_reference_name", None)
        if ref is not None and turns[1:] == [ref]:
            return [], None  # the server retrying the same turn's model call
        turns[0] += 1
        turns[1:] = [ref]
        return [f"model turn {turns[0]}"], f"model turn {turns[0]}"
    if kind == "waiting":
        return ["waiting for a message"], "waiting for a message"
    if kind == "tool_call":
        args = getattr(event, "arguments", {}) or {}
        return [f"tool {name}({', '.join(f'{k}={short(v, 40)}' for k, v in args.items())})"], f"ran {name}"
    if kind == "tool_result":
        return [f"  {name} -> {short(getattr(event, 'result', None))}"], None
    if kind == "tool_started":
        return [], f"running {name}"
    if kind == "tool_finished":
        if getattr(event, "ok", True):
            return [], None
        return [f"tool {name} {getattr(event, 'status', '')}: {short(getattr(event, 'error', '') or '')}"], None
    if kind == "error":
        if says_model_unavailable(getattr(event, "message", "")):
            return [], None  # the model cannot be called: wait() raises one line that says why and what to do
        return [f"error: {short(getattr(event, 'message', ''))}"], None
    if kind == "done":
        return ["done"], "done"
    if kind == "continued":
        return [f"continued as run {getattr(event, 'run', '?')} ({getattr(event, 'next_execution_id', '')})"], None
    if kind == "retired":
        first, last = getattr(event, "first_run", 0), getattr(event, "last_run", 0)
        runs = f"run {first} was" if first == last else f"runs {first}-{last} were"
        line = (f"{runs} retired from the server, {'its' if first == last else 'their'} events are gone "
                "(the listener's totals count them)")
        return [line], None
    if kind == "handoff":
        return [f"handoff to {getattr(event, 'target', '')}"], None
    if kind == "guardrail_fail":
        return [f"guardrail {getattr(event, 'guardrail_name', '')} failed: {getattr(event, 'message', '')}"], None
    if kind == "context_condensed":
        return ["context condensed"], None
    return [], None


class RunWatcher:
    """Follows a run on a background thread and reports it to a :class:`ProgressDisplay`.

    With ``events`` (a callable returning :meth:`AgentHandle.events`' iterator) it renders
    the run's events; otherwise it samples ``fetch()`` (the workflow with its tasks) every
    ``interval`` seconds. Errors are logged, never raised: progress is advisory, the
    caller's ``wait()`` decides the outcome. Owned by one caller: ``start()`` then ``stop()``.
    """

    def __init__(self, display: ProgressDisplay, execution_id: str, *,
                 events: Callable[[], Any] | None = None,
                 fetch: Callable[[], Mapping[str, Any]] | None = None, interval: float = 0.5) -> None:
        if events is None and fetch is None:
            raise ValueError("RunWatcher needs events or fetch")
        self._display = display
        self._events = events
        self._fetch = fetch
        self._tracker = TaskTracker(execution_id)
        self._interval = interval
        self._lock = threading.Lock()
        self._stream: Any = None
        self._stop = threading.Event()
        # daemon: if it died with the process only progress lines would be lost; stop() joins it.
        self._thread = threading.Thread(target=self._run, name=f"conductor-agents-cli-progress-{execution_id}",
                                        daemon=True)

    def start(self) -> RunWatcher:
        """Start following. Raises RuntimeError when called twice."""
        self._display.start()
        self._thread.start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Let the last lines arrive (up to ``grace`` seconds), then stop and join. Idempotent."""
        if self._thread.is_alive():
            self._thread.join(grace)  # an event stream ends by itself after the run's last event
        with self._lock:
            self._stop.set()
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._display.close()

    def _run(self) -> None:
        try:
            if self._events is not None:
                self._follow_events()
            else:
                self._poll()
        except ConductorAgentsError as err:
            log.debug("progress stopped: %s", err)
        except Exception:  # progress must never take the command down
            log.debug("progress failed", exc_info=True)

    def _follow_events(self) -> None:
        assert self._events is not None
        with self._lock:
            if self._stop.is_set():
                return
            stream = self._stream = self._events()
        turns = [0]
        try:
            for event in stream:
                lines, status = describe_event(event, turns)
                for line in lines:
                    self._display.event(line)
                if status is not None:
                    self._display.set_status(status)
        finally:
            stream.close()

    def _poll(self) -> None:
        assert self._fetch is not None
        while True:
            try:
                workflow = self._fetch()
            except ExecutionNotFoundError:
                return
            except ConductorAgentsError as err:
                log.debug("progress sample failed: %s", err)
            else:
                for line in self._tracker.update(workflow):
                    self._display.event(line)
                self._display.set_status(self._tracker.activity or (self._tracker.status or ""))
                if RunStatus.parse(self._tracker.status).is_terminal:
                    return
            if self._stop.wait(self._interval):
                return


class ServedWatch:
    """Says on a :class:`ProgressDisplay`, once, when no process serves the run (``status.served`` is False,
    with for how long and the command that would serve it), and once when one serves it again.

    ``check()`` is :meth:`AgentHandle.status`; it is called at once, then every ``interval`` seconds (the
    liveness check interval) until the run ends or :meth:`stop`. Errors are logged, never raised.
    """

    def __init__(self, display: ProgressDisplay, check: Callable[[], Any], interval: float) -> None:
        self._display = display
        self._check = check
        self._interval = interval
        self._stop = threading.Event()
        self._unserved = False
        # daemon: if it died with the process only this line would be lost; stop() joins it.
        self._thread = threading.Thread(target=self._run, name="conductor-agents-cli-served", daemon=True)

    def start(self) -> ServedWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop checking and join (a check in flight is bounded by the HTTP timeout). Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = self._check()
            except ConductorAgentsError as err:
                log.debug("checking whether the run is served failed: %s", err)
            except Exception:  # progress must never take the command down
                log.debug("checking whether the run is served failed", exc_info=True)
            else:
                if status.is_terminal:
                    return
                self._tell(status)
            if self._stop.wait(self._interval):
                return

    def _tell(self, status: Any) -> None:
        if status.served is False and not self._unserved:
            self._unserved = True
            self._display.event(unserved_line(status.unserved_for))
        elif status.served is True and self._unserved:
            self._unserved = False
            self._display.event("served again: a process polls its tasks")
