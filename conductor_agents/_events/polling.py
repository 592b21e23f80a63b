"""Rebuilds a run's server events from its task list (``GET /workflow/{id}?includeTasks=true``).

Used when the server's event stream is unavailable. The rules mirror what the server's
stream emits (read from its event listener), so both views give the same kinds in the
same order:

- an ``LLM_CHAT_COMPLETE`` task scheduled        → ``thinking`` (at its scheduledTime)
- a ``PULL_WORKFLOW_MESSAGES`` task scheduled    → ``waiting``
- a tool task COMPLETED                          → ``tool_call`` + ``tool_result`` (at its endTime)
- a task FAILED / FAILED_WITH_TERMINAL_ERROR / TIMED_OUT, or a tool task
  COMPLETED_WITH_ERRORS (an optional tool that failed) → ``error``
- the run COMPLETED                              → ``done``
- the run TERMINATED / FAILED / TIMED_OUT        → a run-level ``error``

Events are ordered by the time they happened, then by task sequence. Ids are stable
across polls (``task:<taskId>:<kind>``, ``run:<status>``), so each is reported once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._common.task_names import INTERNAL_TASK_TYPES, MESSAGE_WAIT_TASK_TYPE, MODEL_TASK_TYPE, is_message_wait
from ..events import (
    SOURCE_POLL,
    AgentEvent,
    DoneEvent,
    ErrorEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolResultEvent,
    WaitingEvent,
    tool_arguments,
)

__all__ = ["events_from_workflow"]

#: Task types the server never reports as tool calls (its own machinery).
_SYSTEM_TYPES = frozenset({
    "LLM_CHAT_COMPLETE", "SWITCH", "DO_WHILE", "INLINE", "SET_VARIABLE", "FORK_JOIN_DYNAMIC", "FORK",
    "FORK_JOIN", "JOIN", "SUB_WORKFLOW", "HUMAN", "TERMINATE", "HTTP", "CALL_MCP_TOOL", "PULL_WORKFLOW_MESSAGES",
    "WAIT", "JSON_JQ_TRANSFORM", "EXCLUSIVE_JOIN", "DYNAMIC", "EVENT", "NOOP", "START_WORKFLOW",
})
_FAILED = frozenset({"FAILED", "FAILED_WITH_TERMINAL_ERROR", "TIMED_OUT"})
_RUN_FAILED = frozenset({"TERMINATED", "FAILED", "TIMED_OUT"})

_Keyed = tuple[tuple[float, int, int], AgentEvent]


def _ms(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and value > 0 else 0.0


def _seconds(ms: float) -> float | None:
    return ms / 1000.0 if ms > 0 else None


def is_tool_task(task: Mapping[str, Any]) -> bool:
    """Whether the server reports this task as a tool call (a worker tool, not machinery)."""
    task_type = str(task.get("taskType") or "")
    if not task_type or task_type in _SYSTEM_TYPES or task_type in INTERNAL_TASK_TYPES:
        return False
    return task_type == "SIMPLE" or bool(task.get("taskDefinition"))


_TERMINAL_TASK = frozenset({"COMPLETED", "COMPLETED_WITH_ERRORS", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "CANCELED",
                            "SKIPPED", "TIMED_OUT"})
_EVENTFUL_TYPES = frozenset({MODEL_TASK_TYPE, MESSAGE_WAIT_TASK_TYPE})


def _settled(task: Mapping[str, Any]) -> bool:
    """Whether a task's events can no longer change: it has finished, or it is machinery (a loop, a
    join) that has none (a failure of machinery fails the run, which says so itself)."""
    if str(task.get("status") or "") in _TERMINAL_TASK:
        return True
    eventful = str(task.get("taskType") or "") in _EVENTFUL_TYPES or is_message_wait(task)
    return not eventful and not is_tool_task(task)


class TaskEvents:
    """A run's events from its task list, read in pages from the first task whose events may still change.

    The tasks before it were read once; their events are kept (not the tasks). So each read costs what
    the run's unfinished tail weighs, not the whole run. Not thread-safe: one reader owns it.
    """

    PAGE = 100

    def __init__(self, api: Any, execution_id: str) -> None:
        self._api = api
        self._execution_id = execution_id
        self._offset = 0
        self._settled: list[_Keyed] = []

    def read(self) -> tuple[dict[str, Any], list[AgentEvent]]:
        """The run's status and output (``GET /workflow/{id}/status``; its end, once it ended) and every
        event its tasks imply, oldest first."""
        status = dict(self._api.workflow_status(self._execution_id, include_output=True))
        if str(status.get("status") or "") in ("COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"):
            detail = self._api.agent_status(self._execution_id, timeout=10.0)
            for key in ("reasonForIncompletion", "endTime"):
                status.setdefault(key, detail.get(key))
        fresh: list[Mapping[str, Any]] = []
        start = self._offset
        while True:
            page = self._api.workflow_tasks(self._execution_id, start=start, count=self.PAGE)
            fresh.extend(t for t in page.tasks if isinstance(t, Mapping))
            start += len(page.tasks)
            if len(page.tasks) < self.PAGE or start >= page.total:
                break
        keyed: list[_Keyed] = []
        settling = True
        for task in fresh:
            events = _task_events(task, self._execution_id)
            if settling and _settled(task):
                self._settled.extend(events)
                self._offset += 1
            else:
                settling = False
                keyed.extend(events)
        workflow = {"status": status.get("status"), "endTime": status.get("endTime"),
                    "output": status.get("output"), "reasonForIncompletion": status.get("reasonForIncompletion")}
        return workflow, _in_order(self._settled + keyed, workflow, self._execution_id)


def tool_name(task: Mapping[str, Any]) -> str:
    """The tool name the server reports: the input's ``method``, else the task type."""
    inputs = task.get("inputData") or {}
    method = inputs.get("method") if isinstance(inputs, Mapping) else None
    return str(method) if method else str(task.get("taskType") or "")


def tool_result_value(task: Mapping[str, Any]) -> Any:
    """What the server reports as a tool's result: ``output["result"]`` if set, else the output map."""
    output = task.get("outputData") or {}
    if isinstance(output, Mapping) and output.get("result") is not None:
        return output["result"]
    return dict(output) if isinstance(output, Mapping) else output


def _task_events(task: Mapping[str, Any], execution_id: str) -> list[_Keyed]:
    task_id = str(task.get("taskId") or "")
    ref = str(task.get("referenceTaskName") or "")
    task_type = str(task.get("taskType") or "")
    status = str(task.get("status") or "")
    seq = int(task.get("seq") or 0)
    scheduled, ended = _ms(task.get("scheduledTime")), _ms(task.get("endTime") or task.get("updateTime"))

    def common(kind: str, at: float) -> dict[str, Any]:
        return {"execution_id": execution_id, "id": f"task:{task_id}:{kind}", "timestamp": _seconds(at),
                "source": SOURCE_POLL}

    out: list[_Keyed] = []
    if task_type == MODEL_TASK_TYPE:
        out.append(((scheduled, seq, 0), ThinkingEvent(**common("thinking", scheduled), task_reference_name=ref)))
    elif is_message_wait(task):
        out.append(((scheduled, seq, 0), WaitingEvent(**common("waiting", scheduled), task_reference_name=ref,
                                                      pending_tool={"taskRefName": ref})))
    elif task_type == "HUMAN":  # a person is awaited: the same pendingTool the server streams
        out.append(((scheduled, seq, 0), WaitingEvent(**common("waiting", scheduled), task_reference_name=ref,
                                                      pending_tool=human_pending_tool(task))))
    if status == "COMPLETED" and is_tool_task(task):
        name = tool_name(task)
        out.append(((ended, seq, 1), ToolCallEvent(**common("tool_call", ended), tool_name=name,
                                                   arguments=tool_arguments(task.get("inputData")))))
        out.append(((ended, seq, 2), ToolResultEvent(**common("tool_result", ended), tool_name=name,
                                                     result=tool_result_value(task))))
    elif status in _FAILED or (status == "COMPLETED_WITH_ERRORS" and is_tool_task(task)):
        message = str(task.get("reasonForIncompletion") or ("Task timed out" if status == "TIMED_OUT" else ""))
        out.append(((ended, seq, 1), ErrorEvent(**common("error", ended), task_reference_name=ref, message=message)))
    return out


def human_pending_tool(task: Mapping[str, Any]) -> dict[str, Any]:
    """The ``pendingTool`` of a HUMAN task, in the shape of the server's ``waiting`` event."""
    inputs = task.get("inputData") or {}
    pending: dict[str, Any] = {"taskRefName": str(task.get("referenceTaskName") or "")}
    calls = inputs.get("tool_calls") if isinstance(inputs, Mapping) else None
    if isinstance(calls, list):
        pending["toolCalls"] = [{"name": c.get("name"), "args": c.get("inputParameters") or c.get("input") or {}}
                                for c in calls if isinstance(c, Mapping)]
    if isinstance(inputs, Mapping) and inputs.get("response_schema") is not None:
        pending["response_schema"] = inputs["response_schema"]
    return pending


def as_listed(event: WaitingEvent, listed: Sequence[AgentEvent]) -> WaitingEvent | None:
    """A streamed ``waiting`` event as the task list (``listed``) tells it; None when its task is not listed yet.

    A listener's wait for messages on a ``HUMAN`` task (``listener_wait="human"``) streams the task's form like a
    question to a person; its task's mark says otherwise (its listed event is no person's wait)."""
    read = next((e for e in listed if isinstance(e, WaitingEvent)
                 and e.task_reference_name == event.task_reference_name), None)
    if read is None:
        return None
    return event if read.for_person else attrs.evolve(event, pending_tool=read.pending_tool)


def events_from_workflow(workflow: Mapping[str, Any], execution_id: str) -> list[AgentEvent]:
    """Every event the run's current state implies, oldest first."""
    keyed: list[_Keyed] = []
    for task in workflow.get("tasks") or ():
        if isinstance(task, Mapping):
            keyed.extend(_task_events(task, execution_id))
    return _in_order(keyed, workflow, execution_id)


def _in_order(keyed: list[_Keyed], workflow: Mapping[str, Any], execution_id: str) -> list[AgentEvent]:
    keyed = sorted(keyed, key=lambda pair: pair[0])
    events = [event for _, event in keyed]
    status = str(workflow.get("status") or "")
    ended = _ms(workflow.get("endTime") or workflow.get("updateTime"))
    common: dict[str, Any] = {"execution_id": execution_id, "id": f"run:{status}", "timestamp": _seconds(ended),
                              "source": SOURCE_POLL}
    if status == "COMPLETED":
        output = workflow.get("output")
        events.append(DoneEvent(**common, output=output if isinstance(output, Mapping) else {}))
    elif status in _RUN_FAILED:
        message = str(workflow.get("reasonForIncompletion") or "Workflow terminated")
        events.append(ErrorEvent(**common, message=message, run_level=True))
    return events
