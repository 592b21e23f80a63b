"""What a run produced: :class:`AgentResult` and its parts, built from server data."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._common.answer_text import answer_text
from ._common.task_names import INTERNAL_TASK_TYPES, is_message_wait

__all__ = ["AgentResult", "AgentStatus", "ListenerTotals", "RunStatus", "TokenUsage", "ToolCallRecord"]

#: Input keys the server adds to every tool task; they are not the model's arguments.
SERVER_INPUT_KEYS = frozenset({"method", "_agent_state", "_agent_tool_name"})

#: Task types that are the server's own machinery, never a tool call.
_TOOL_TASK_TYPES_EXCLUDED = frozenset({
    "INLINE", "SET_VARIABLE", "DO_WHILE", "LLM_CHAT_COMPLETE", "SWITCH", "FORK", "FORK_JOIN_DYNAMIC",
    "JOIN", "DYNAMIC", "SUB_WORKFLOW", "TERMINATE", "EXCLUSIVE_JOIN", "JSON_JQ_TRANSFORM",
}) | INTERNAL_TASK_TYPES


class RunStatus(str, enum.Enum):
    """A run's status as the server reports it."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TERMINATED = "TERMINATED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def is_terminal(self) -> bool:
        """Whether the run has ended (nothing more will happen)."""
        return self not in (RunStatus.RUNNING, RunStatus.PAUSED)

    @classmethod
    def parse(cls, value: Any) -> RunStatus:
        """The status named by ``value``; unknown names count as RUNNING (never terminal by accident)."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.RUNNING


@attrs.frozen
class TokenUsage:
    """LLM tokens a run used, as the server counted them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TokenUsage:
        data = data or {}
        return cls(
            prompt_tokens=int(data.get("promptTokens") or 0),
            completion_tokens=int(data.get("completionTokens") or 0),
            total_tokens=int(data.get("totalTokens") or 0),
        )


@attrs.frozen
class ListenerTotals:
    """What a listener has done over all its runs (:meth:`AgentHandle.totals`), also once retention has
    removed the older runs from the server: it is carried forward in each new run's commit record.

    ``runs`` counts every run the listener has had (the current one included), retired ones too, ``turns``
    its model turns, ``messages`` the messages its runs pulled (the senders' messages: the SDK's own control
    messages, such as the one ``stop()`` pushes, do not count), ``token_usage`` the model tokens of all its runs;
    ``history`` is the compact record of what it did before its current run (one line per
    conversation item, the oldest ones cut first: ``Continuation.record_chars``), ``""`` before the first
    continuation. ``current_execution_id`` is the run the figures were read up to.
    """

    runs: int = 1
    turns: int = 0
    messages: int = 0
    token_usage: TokenUsage = attrs.field(factory=TokenUsage)
    history: str = attrs.field(default="", repr=False)
    current_execution_id: str | None = None


@attrs.frozen
class ToolCallRecord:
    """One tool call of a run: what the model asked for and what came back.

    ``name`` is the tool's name, also readable as ``tool_name`` (what events and pending requests call it).
    """

    name: str
    task_reference_name: str
    status: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    output: Mapping[str, Any] = attrs.field(factory=dict)
    error: str | None = None

    @property
    def tool_name(self) -> str:
        """The tool's name (:attr:`name`), as events (``ToolCallEvent.tool_name``) and ``PendingRequest.tool_name``
        say it."""
        return self.name

    @classmethod
    def from_task(cls, task: Mapping[str, Any]) -> ToolCallRecord:
        raw_input = task.get("inputData") or {}
        return cls(
            name=str(task.get("taskDefName") or task.get("taskType") or ""),
            task_reference_name=str(task.get("referenceTaskName") or ""),
            status=str(task.get("status") or ""),
            arguments={k: v for k, v in raw_input.items() if k not in SERVER_INPUT_KEYS},
            output=without_control_messages(task.get("outputData")) if is_message_wait(task)
            else dict(task.get("outputData") or {}),
            error=task.get("reasonForIncompletion") or None,
        )

    @classmethod
    def from_agent_tool_task(cls, task: Mapping[str, Any]) -> ToolCallRecord:
        """The call of an agent tool: a ``SUB_WORKFLOW`` task whose input names the tool."""
        sub_input = (task.get("inputData") or {}).get("workflowInput") or {}
        return cls(
            name=str(sub_input.get(AGENT_TOOL_INPUT_KEY) or ""),
            task_reference_name=str(task.get("referenceTaskName") or ""),
            status=str(task.get("status") or ""),
            arguments={k: v for k, v in sub_input.items() if k not in _SUB_RUN_INPUT_KEYS},
            output=dict(task.get("outputData") or {}),
            error=task.get("reasonForIncompletion") or None,
        )


#: The key the server puts in an agent tool's sub-run input: the name of the tool the model called.
AGENT_TOOL_INPUT_KEY = "_agent_tool_name"
#: Keys of a sub-run's input that the server adds (not the model's arguments).
_SUB_RUN_INPUT_KEYS = frozenset({AGENT_TOOL_INPUT_KEY, "__today__", "session_id", "media", "context"})


def _agent_tool_name(task: Mapping[str, Any]) -> str | None:
    if str(task.get("taskType") or "") != "SUB_WORKFLOW":
        return None
    sub_input = (task.get("inputData") or {}).get("workflowInput")
    name = sub_input.get(AGENT_TOOL_INPUT_KEY) if isinstance(sub_input, Mapping) else None
    return str(name) if name else None


def tool_calls_from_tasks(tasks: Sequence[Mapping[str, Any]]) -> tuple[ToolCallRecord, ...]:
    """The tool calls among a workflow's tasks (agent tools included), in the order they were scheduled."""
    calls = []
    for task in tasks:
        if _agent_tool_name(task) is not None:
            calls.append(ToolCallRecord.from_agent_tool_task(task))
        elif (str(task.get("taskType") or "") not in _TOOL_TASK_TYPES_EXCLUDED and not _is_approval_gate(task)
              and not _GUARDRAIL_WORKER.search(str(task.get("referenceTaskName") or ""))):
            calls.append(ToolCallRecord.from_task(task))
    return tuple(calls)


def sub_agents_from_tasks(tasks: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[str, ...]:
    """The sub-agents (of ``names``) that answered in a run, in the order they were scheduled.

    The server runs each sub-agent as a ``SUB_WORKFLOW`` task named after it (3.32.3).
    """
    wanted = set(names)
    return tuple(
        str(task.get("taskDefName"))
        for task in tasks
        if str(task.get("taskType") or "") == "SUB_WORKFLOW" and task.get("status") == "COMPLETED"
        and str(task.get("taskDefName")) in wanted and _agent_tool_name(task) is None
    )


#: The server's reference of a function guardrail's worker task (the agent's, a tool's, the output_type
#: check's): a check of an answer, no tool call of the model's.
_GUARDRAIL_WORKER = re.compile(r"_output_guardrail_.+_worker(__\d+)?$")


def _is_approval_gate(task: Mapping[str, Any]) -> bool:
    # The HUMAN tasks the server puts before tools that need approval, and for a guardrail's review
    # of an answer (on_fail="human"), are no tool calls of the model.
    ref = str(task.get("referenceTaskName") or "")
    return str(task.get("taskType")) == "HUMAN" and ("_approval_human" in ref or "_guardrail_human" in ref)


@attrs.frozen
class AgentStatus:
    """A snapshot of a run (``GET /agent/{id}/status``)."""

    execution_id: str
    status: RunStatus
    is_waiting: bool = False
    pending_tool: Mapping[str, Any] | None = None
    output: Mapping[str, Any] | None = None
    reason: str | None = None
    #: The listener's current run (``execution_id`` until it was first continued) and how many it has had.
    current_execution_id: str | None = None
    runs: int = 1
    #: What a run not ended waits for: ``"person"`` (an approval, an answer, a review), ``"message"`` (the next
    #: message) or None (it is working, or it ended). Set by :meth:`AgentHandle.status`.
    waiting_for: str | None = None
    #: Whether a process serves the run now: False when no process has polled its tasks for longer than
    #: ``liveness_stall_seconds`` (``unserved_for`` says how many seconds; serve it with ``conductor-agents
    #: serve MODULE:AGENT``, ``runtime.serve(agent)`` or ``runtime.resume``), None when that cannot be told
    #: (ended, paused, a stateless run, too soon). Set by :meth:`AgentHandle.status` (``docs/concepts.md``).
    served: bool | None = None
    unserved_for: float | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentStatus:
        return cls(
            execution_id=str(data.get("executionId") or ""),
            status=RunStatus.parse(data.get("status")),
            is_waiting=bool(data.get("isWaiting")),
            pending_tool=data.get("pendingTool"),
            output=data.get("output"),
            reason=data.get("reasonForIncompletion") or None,
        )


def _answer_text(value: Any) -> str | None:
    """The run's answer as text: an object the server parsed from JSON is shown as JSON again."""
    return None if value is None else answer_text(value)


def _calls_shown(calls: tuple[ToolCallRecord, ...]) -> str:
    """The tool calls in a result's repr: how many and their names, not every argument and output (a
    listener's would print every message it read)."""
    names = [call.name for call in calls]
    more = f", ... {len(names) - 5} more" if len(names) > 5 else ""
    return f"<{len(names)}: {', '.join(names[:5])}{more}>" if names else "()"


@attrs.frozen
class AgentResult:
    """The outcome of a finished run. FAILED, TERMINATED and TIMED_OUT are results, not errors.

    ``output`` is the final answer: text, or an instance of the agent's ``output_type`` when it
    has one (``text`` keeps the answer as text either way). ``context`` is the run's context as it
    ended (``start(context=...)`` plus the tools' updates).

    ``tool_calls`` (oldest first) and ``token_usage`` cover every run of the agent that the server still
    holds: a continued listener's every held run, oldest first, not only the run it ended in
    (``retired_runs`` says how many older runs retention removed; ``totals`` counts those too). A message
    wait's ``output`` lists the senders' messages only (never the SDK's own control messages).
    """

    execution_id: str
    status: RunStatus
    output: Any = None
    finish_reason: str | None = None
    error: str | None = None
    token_usage: TokenUsage = attrs.field(factory=TokenUsage)
    tool_calls: tuple[ToolCallRecord, ...] = attrs.field(default=(), repr=_calls_shown)
    raw_output: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    context: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    #: A continued listener: the run it ended in (its last), and how many runs it had (``retired_runs`` of
    #: them no longer on the server).
    current_execution_id: str | None = None
    runs: int = 1
    #: An agent with sub-agents: the ones that answered, in order (a parallel run: every branch).
    agents_run: tuple[str, ...] = ()
    #: A continued listener: its totals over every run, the retired ones included (``token_usage`` above
    #: covers the runs still held).
    totals: ListenerTotals | None = None
    #: Why a COMPLETED run ended: ``"stop"`` (``stop()`` was asked: ``output`` is the model's answer
    #: when it answered the stop signal, else None), ``"turn_limit"`` (``max_turns`` ran out while the
    #: model still asked for tools: ``output`` is None) or ``"answer"`` (the model answered); None when
    #: the run did not complete or it cannot be told. ``raw_output`` keeps what the server said.
    ended_by: str | None = None
    #: How long the run took on the server, start to end, in seconds (None when the server did not say).
    #: A continued listener: its last run's.
    duration_seconds: float | None = None
    #: A continued listener: how many of its ``runs`` retention had removed from the server when the result
    #: was read (``Continuation.keep_runs``, ``keep_for``): always its oldest runs (after the first one, for
    #: a listener without a mailbox). Their tool calls and tokens are not in ``tool_calls`` and
    #: ``token_usage``; ``totals`` counts them.
    retired_runs: int = 0

    @property
    def answered_by(self) -> str | None:
        """The sub-agent whose answer the run ended on (the last of ``agents_run``); None when
        no sub-agent answered. A handoff or router parent's model still writes the final text
        from it unless ``synthesize=False``."""
        return self.agents_run[-1] if self.agents_run else None

    @property
    def ok(self) -> bool:
        """True when the run COMPLETED."""
        return self.status is RunStatus.COMPLETED

    @property
    def text(self) -> str | None:
        """The final answer as text (JSON when the server parsed it into an object)."""
        return _answer_text(self.raw_output.get("result"))

    @classmethod
    def from_server(
        cls,
        status: AgentStatus,
        detail: Mapping[str, Any] | None = None,
        tasks: Sequence[Mapping[str, Any]] = (),
        agent_names: Sequence[str] = (),
        workflow: Mapping[str, Any] | None = None,
    ) -> AgentResult:
        """Combine the terminal status, the run detail and the task list into a result
        (``agent_names``: the agent's sub-agents, to find which of them answered; ``workflow``: the
        run's workflow, whose start and end times give ``duration_seconds``)."""
        raw = dict(status.output or (detail or {}).get("output") or {})
        ended_by = _ended_by(status.status, raw.get("finishReason"), workflow)
        no_answer = raw.get("finishReason") == _TOOL_CALLS and ended_by in (ENDED_BY_STOP, ENDED_BY_TURN_LIMIT)
        result = None if no_answer else _answer_text(raw.get("result"))
        context = raw.get("context")
        error = status.reason or (detail or {}).get("reasonForIncompletion") or None
        return cls(
            execution_id=status.execution_id,
            status=status.status,
            output=result,
            finish_reason=raw.get("finishReason"),
            error=error,
            token_usage=TokenUsage.from_dict((detail or {}).get("tokenUsage")),
            tool_calls=tool_calls_from_tasks(tasks),
            agents_run=sub_agents_from_tasks(tasks, agent_names) if agent_names else (),
            raw_output=raw,
            context=dict(context) if isinstance(context, Mapping) else {},
            duration_seconds=_duration(workflow or {}) or _duration(detail or {}),
            ended_by=ended_by,
        )


ENDED_BY_ANSWER = "answer"
ENDED_BY_STOP = "stop"
ENDED_BY_TURN_LIMIT = "turn_limit"
#: The finish reason of a model turn that asked for tools (the server's): the loop ended without an answer.
_TOOL_CALLS = "TOOL_CALLS"


#: The message ``AgentHandle.stop()`` pushes so a blocked wait-for-message tool wakes up.
STOP_SIGNAL = {"_signal": "stop"}
#: The key of the SDK's own control messages (``{"_signal": ...}`` and nothing else): reserved.
CONTROL_KEY = "_signal"


def is_control_message(payload: Any) -> bool:
    """Whether a message's payload is one of the SDK's own control messages (``STOP_SIGNAL``; any payload
    whose only key is ``"_signal"``), which is never counted or shown as a sender's message."""
    return isinstance(payload, Mapping) and len(payload) == 1 and CONTROL_KEY in payload


def without_control_messages(output: Any) -> dict[str, Any]:
    """A message wait's output without the SDK's control messages (``count`` follows), as a new dict."""
    out = dict(output) if isinstance(output, Mapping) else {}
    messages = out.get("messages")
    if isinstance(messages, list):
        kept = [m for m in messages if not (isinstance(m, Mapping) and is_control_message(m.get("payload")))]
        if len(kept) != len(messages):
            out["messages"] = kept
            if isinstance(out.get("count"), int):
                out["count"] = len(kept)
    return out


def stop_requested(workflow: Mapping[str, Any]) -> bool:
    """Whether a graceful stop was asked of the run (the agent loop's ``_stop_requested`` variable)."""
    variables = workflow.get("variables")
    return isinstance(variables, Mapping) and variables.get("_stop_requested") is True


def _stop_signal_delivered(workflow: Mapping[str, Any]) -> bool:
    """Whether a wait-for-message task of the run pulled the stop signal. The loop variable alone does
    not tell: when the model gets to answer the signal, the server's next state update clears it."""
    for task in workflow.get("tasks") or ():
        output = task.get("outputData") if isinstance(task, Mapping) else None
        messages = output.get("messages") if isinstance(output, Mapping) else None
        if isinstance(messages, list) and any(isinstance(m, Mapping) and m.get("payload") == STOP_SIGNAL
                                              for m in messages):
            return True
    return False


def _ended_by(status: RunStatus, finish_reason: Any, workflow: Mapping[str, Any] | None) -> str | None:
    """See :attr:`AgentResult.ended_by`. A run asked to stop says so whether or not the model answered
    first; otherwise the server ends its loop after a turn of tool calls only when the turns ran out."""
    if status is not RunStatus.COMPLETED:
        return None
    if workflow is not None and (stop_requested(workflow) or _stop_signal_delivered(workflow)):
        return ENDED_BY_STOP
    if finish_reason is None:
        return None
    if finish_reason != _TOOL_CALLS:
        return ENDED_BY_ANSWER
    return None if workflow is None else ENDED_BY_TURN_LIMIT


def _duration(detail: Mapping[str, Any]) -> float | None:
    """The run's ``endTime - startTime`` (epoch milliseconds) in seconds, or None."""
    start, end = detail.get("startTime"), detail.get("endTime")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)) and 0 < start <= end:
        return (end - start) / 1000.0
    return None
