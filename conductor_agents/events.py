"""What happens in a run, as typed events: :meth:`AgentHandle.events` yields these.

Server events come from the Conductor server's stream (``GET /agent/stream/{id}``) or,
when the stream is unavailable, are rebuilt from the run's task list; local events say
what a tool body did in *this* process. Every event is an immutable value with the same
common fields (``kind``, ``execution_id``, ``id``, ``timestamp``, ``source``) plus the data
of its kind. See ``docs/events.md``.

=====================  =========================  ============================================
kind                   class                      when
=====================  =========================  ============================================
``thinking``           :class:`ThinkingEvent`     an LLM call was scheduled
``waiting``            :class:`WaitingEvent`      a wait-for-message task was scheduled, or the run
                                                  waits for a person (``for_person``)
``tool_call``          :class:`ToolCallEvent`     a tool task completed (its arguments)
``tool_result``        :class:`ToolResultEvent`   right after, with the tool's output
``error``              :class:`ErrorEvent`        a task failed, or the run failed/was cancelled
``done``               :class:`DoneEvent`         the run COMPLETED
``handoff``            :class:`HandoffEvent`      a sub-agent took over
``guardrail_pass``     :class:`GuardrailEvent`    a guardrail passed
``guardrail_fail``     :class:`GuardrailEvent`    a guardrail failed
``context_condensed``  :class:`ContextCondensedEvent`  the conversation was condensed
``continued``          :class:`ContinuedEvent`    the listener moved to a fresh run (a continuation)
``retired``            :class:`RetiredEvent`      runs of the listener are no longer on the server
                                                  (retention removed them): their events are gone
``tool_started``       :class:`ToolStartedEvent`  (local) a tool body started in this process
``tool_finished``      :class:`ToolFinishedEvent` (local) it returned or raised
=====================  =========================  ============================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._common.answer_text import answer_text
from ._people.pending import PendingToolCall
from ._wire.sse import SseMessage
from .result import SERVER_INPUT_KEYS

__all__ = [
    "AgentEvent",
    "ContextCondensedEvent",
    "ContinuedEvent",
    "DoneEvent",
    "ErrorEvent",
    "GuardrailEvent",
    "HandoffEvent",
    "RetiredEvent",
    "ThinkingEvent",
    "ToolCallEvent",
    "ToolFinishedEvent",
    "ToolResultEvent",
    "ToolStartedEvent",
    "WaitingEvent",
    "event_from_sse",
]

log = logging.getLogger("conductor_agents.events")

#: The ``toolName`` the server gives an ``error`` event about the whole run.
RUN_ERROR_SCOPE = "workflow"

#: Where an event came from.
SOURCE_STREAM = "stream"   # the server's event stream
SOURCE_POLL = "poll"       # rebuilt from the run's task list (the stream was unavailable)
SOURCE_LOCAL = "local"     # this process's tool workers


def _freeze(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class AgentEvent:
    """Fields every event has.

    ``id`` is unique within the run: the server's event id for streamed events (``"7"``),
    ``"task:<taskId>:<kind>"`` / ``"run:<status>"`` for events rebuilt by polling,
    ``"local:<taskId>:<kind>"`` for local ones. ``timestamp`` is epoch seconds (server
    time for server events, this machine's for local ones).
    """

    kind: str = attrs.field(default="event", init=False)
    execution_id: str
    id: str
    timestamp: float | None = None
    source: str = SOURCE_STREAM

    @property
    def ends_run(self) -> bool:
        """True for the last event of a run (``done``, or a run-level ``error``)."""
        return False


@attrs.frozen(kw_only=True)
class ThinkingEvent(AgentEvent):
    """The server scheduled an LLM call (``task_reference_name`` names that LLM task)."""

    kind: str = attrs.field(default="thinking", init=False)
    task_reference_name: str = ""


@attrs.frozen(kw_only=True)
class WaitingEvent(AgentEvent):
    """The run waits: for an external message, for a person (``for_person``: tool calls to approve,
    a :class:`~conductor_agents.HumanTool` question), or it was paused (``task_reference_name`` None)."""

    kind: str = attrs.field(default="waiting", init=False)
    task_reference_name: str | None = None
    pending_tool: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze)

    @property
    def for_person(self) -> bool:
        """Whether a person is awaited (the server's ``HUMAN`` task: it shows a form or calls to approve)."""
        return self.pending_tool.get("response_schema") is not None or bool(self.pending_tool.get("toolCalls"))

    @property
    def for_review(self) -> bool:
        """Whether a person is asked to review an answer a guardrail stopped (``on_fail="human"``;
        see :attr:`PendingRequest.REVIEW <conductor_agents.PendingRequest.REVIEW>`)."""
        ref = self.pending_tool.get("taskRefName") or self.task_reference_name or ""
        return self.for_person and "_guardrail_human" in str(ref)

    @property
    def tool_calls(self) -> tuple[PendingToolCall, ...]:
        """The tool calls awaiting approval (empty for a question or a message wait)."""
        calls = self.pending_tool.get("toolCalls")
        return tuple(PendingToolCall(str(c.get("name") or ""), tool_arguments(c.get("args")))
                     for c in calls or () if isinstance(c, Mapping))


@attrs.frozen(kw_only=True)
class ToolCallEvent(AgentEvent):
    """A tool call, reported by the server once the tool task **completed**.

    ``arguments`` are the model's arguments (the server's own input keys removed). A
    failed tool gets an :class:`ErrorEvent` instead of a call/result pair.
    """

    kind: str = attrs.field(default="tool_call", init=False)
    tool_name: str = ""
    arguments: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze)


@attrs.frozen(kw_only=True)
class ToolResultEvent(AgentEvent):
    """What a completed tool returned (its output map, or its ``result`` value when it has one)."""

    kind: str = attrs.field(default="tool_result", init=False)
    tool_name: str = ""
    result: Any = None


@attrs.frozen(kw_only=True)
class ErrorEvent(AgentEvent):
    """A task failed (``task_reference_name`` set), or the whole run ended badly (``run_level``).

    The server sends a run-level error *instead of* ``done`` when the run is
    TERMINATED, FAILED or TIMED_OUT; the event stream ends after it.
    """

    kind: str = attrs.field(default="error", init=False)
    message: str = ""
    task_reference_name: str | None = None
    run_level: bool = False

    @property
    def ends_run(self) -> bool:
        return self.run_level


@attrs.frozen(kw_only=True)
class DoneEvent(AgentEvent):
    """The run COMPLETED. ``output`` is the run's output map (``result``, ``finishReason``...)."""

    kind: str = attrs.field(default="done", init=False)
    output: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze)

    @property
    def result(self) -> str | None:
        """The run's final text (``output["result"]``)."""
        value = self.output.get("result")
        return None if value is None else answer_text(value)

    @property
    def finish_reason(self) -> str | None:
        return self.output.get("finishReason")

    @property
    def ends_run(self) -> bool:
        return True


@attrs.frozen(kw_only=True)
class ContinuedEvent(AgentEvent):
    """The listener was continued: ``execution_id`` (the run that ended) goes on as
    ``next_execution_id``, its run number ``run`` (2 for the first continuation). The events of
    the new run follow. See ``docs/concepts.md``."""

    kind: str = attrs.field(default="continued", init=False)
    next_execution_id: str = ""
    run: int = 2


@attrs.frozen(kw_only=True)
class RetiredEvent(AgentEvent):
    """Runs ``first_run`` to ``last_run`` of a continued listener (1 is its first run) were here in its
    history, but retention removed them from the server (``Continuation.keep_runs``, ``keep_for``): their
    events are gone; :meth:`AgentHandle.totals` still counts their turns, messages and tokens.
    ``execution_id`` is the id the caller holds. See ``docs/concepts.md``."""

    kind: str = attrs.field(default="retired", init=False)
    first_run: int = 1
    last_run: int = 1

    @property
    def count(self) -> int:
        """How many runs were retired here."""
        return self.last_run - self.first_run + 1


@attrs.frozen(kw_only=True)
class HandoffEvent(AgentEvent):
    """Control passed to another agent (``target``)."""

    kind: str = attrs.field(default="handoff", init=False)
    target: str = ""


@attrs.frozen(kw_only=True)
class GuardrailEvent(AgentEvent):
    """A guardrail ran: ``kind`` is ``guardrail_pass`` or ``guardrail_fail``."""

    kind: str = attrs.field(default="guardrail_pass", validator=attrs.validators.in_(
        ("guardrail_pass", "guardrail_fail")))
    guardrail_name: str = ""
    message: str | None = None

    @property
    def passed(self) -> bool:
        return self.kind == "guardrail_pass"


@attrs.frozen(kw_only=True)
class ContextCondensedEvent(AgentEvent):
    """The server condensed the conversation to fit the model's context."""

    kind: str = attrs.field(default="context_condensed", init=False)
    messages_before: int | None = None
    messages_after: int | None = None
    exchanges_condensed: int | None = None


@attrs.frozen(kw_only=True)
class ToolStartedEvent(AgentEvent):
    """(local) A tool body started running in this process."""

    kind: str = attrs.field(default="tool_started", init=False)
    source: str = SOURCE_LOCAL
    tool_name: str = ""
    task_id: str = ""
    task_reference_name: str = ""


@attrs.frozen(kw_only=True)
class ToolFinishedEvent(AgentEvent):
    """(local) A tool body finished in this process.

    ``status`` is the task status reported to the server (``COMPLETED``,
    ``FAILED_WITH_TERMINAL_ERROR``, or ``ERROR`` for a bug in the worker itself);
    ``error`` holds the exception text when the tool raised.
    """

    kind: str = attrs.field(default="tool_finished", init=False)
    source: str = SOURCE_LOCAL
    tool_name: str = ""
    task_id: str = ""
    task_reference_name: str = ""
    status: str = "COMPLETED"
    duration_seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "COMPLETED"


# -- from the server's wire format ------------------------------------------------------------


def tool_arguments(raw: Any) -> dict[str, Any]:
    """A tool task's input without the keys the server adds (``method``, ``_agent_state``...)."""
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if k not in SERVER_INPUT_KEYS}


def _timestamp(data: Mapping[str, Any]) -> float | None:
    value = data.get("timestamp")
    return value / 1000.0 if isinstance(value, (int, float)) and value > 0 else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _error(common: dict[str, Any], data: Mapping[str, Any]) -> ErrorEvent:
    scope = data.get("toolName")
    run_level = scope == RUN_ERROR_SCOPE
    return ErrorEvent(**common, message=str(data.get("content") or ""), run_level=run_level,
                      task_reference_name=None if run_level or scope is None else str(scope))


def _waiting(common: dict[str, Any], data: Mapping[str, Any]) -> WaitingEvent:
    pending = data.get("pendingTool")
    if not isinstance(pending, Mapping):
        pending = {}
    ref = pending.get("taskRefName")
    return WaitingEvent(**common, pending_tool=pending, task_reference_name=str(ref) if ref else None)


_BUILDERS: dict[str, Callable[[dict[str, Any], Mapping[str, Any]], AgentEvent]] = {
    "thinking": lambda c, d: ThinkingEvent(**c, task_reference_name=str(d.get("content") or "")),
    "waiting": _waiting,
    "tool_call": lambda c, d: ToolCallEvent(**c, tool_name=str(d.get("toolName") or ""),
                                            arguments=tool_arguments(d.get("args"))),
    "tool_result": lambda c, d: ToolResultEvent(**c, tool_name=str(d.get("toolName") or ""), result=d.get("result")),
    "error": _error,
    "done": lambda c, d: DoneEvent(**c, output=d.get("output") if isinstance(d.get("output"), Mapping) else {
        "result": d.get("output")}),
    "handoff": lambda c, d: HandoffEvent(**c, target=str(d.get("target") or "")),
    "guardrail_pass": lambda c, d: GuardrailEvent(**c, kind="guardrail_pass",
                                                  guardrail_name=str(d.get("guardrailName") or "")),
    "guardrail_fail": lambda c, d: GuardrailEvent(**c, kind="guardrail_fail",
                                                  guardrail_name=str(d.get("guardrailName") or ""),
                                                  message=d.get("content")),
    "context_condensed": lambda c, d: ContextCondensedEvent(
        **c, messages_before=_int_or_none(d.get("messagesBefore")),
        messages_after=_int_or_none(d.get("messagesAfter")),
        exchanges_condensed=_int_or_none(d.get("exchangesCondensed"))),
}

#: The server event types this SDK turns into typed events; others are ignored.
KNOWN_KINDS = frozenset(_BUILDERS)


def event_from_sse(message: SseMessage, execution_id: str) -> AgentEvent | None:
    """The typed event for one server-sent event, or None (unknown type, malformed data).

    The SSE ``event:`` name decides the type (the JSON ``type`` when the name is missing);
    ``id`` is the SSE id (the JSON ``id`` when missing).
    """
    try:
        data = json.loads(message.data)
    except ValueError:
        log.debug("ignoring a server event whose data is not JSON: %.200r", message.data)
        return None
    if not isinstance(data, Mapping):
        log.debug("ignoring a server event whose data is not an object: %.200r", message.data)
        return None
    kind = message.event if message.event != "message" else str(data.get("type") or "message")
    builder = _BUILDERS.get(kind)
    if builder is None:
        log.debug("ignoring server event of unknown type %r (id %s)", kind, message.id or data.get("id"))
        return None
    event_id = message.id or (str(data["id"]) if data.get("id") is not None else "")
    common = {"execution_id": str(data.get("executionId") or execution_id), "id": event_id,
              "timestamp": _timestamp(data), "source": SOURCE_STREAM}
    return builder(common, data)
