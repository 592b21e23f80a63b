"""What a run waits for from a person, and what answered it: read from the run's task list.

Two things make a run wait for a person, both ``HUMAN`` tasks on the server (they need no worker,
have no task domain, and never count as a stall):

- **approval**: before tools marked ``approval_required`` run, the server compiles a check, a
  switch and a ``HUMAN`` task (``<agent>_approval_human__<turn>``) that gates the whole batch of
  tool calls of that turn. Its answer goes through an INLINE ``..._approval_human_process__<turn>``
  task whose output (``{approved, reason, extra}``) the run routes on; the server ends the run
  (COMPLETED, no tool runs) when ``approved`` is false. So this SDK answers a rejection with
  ``approved: true`` and ``decision: "rejected"``: the run goes on, and the SDK's worker for each
  approval-required tool of the batch reads the decision from that process task and reports the
  rejection as the call's result instead of running it, so the model sees it (and the listener
  keeps listening).
- **question**: a :class:`~conductor_agents.HumanTool` call is itself a ``HUMAN`` task in the
  turn's fork; its output is the tool result the model sees (through the turn's JOIN).
- **pick** (a question with ``options``): a ``manual`` team's turn is a ``HUMAN`` task
  ``<agent>_pick_agent`` (its input: ``agent_options``, the sub-agents' names, and the
  ``conversation``); the run goes on with the output the next task, ``<agent>_process_selection``
  (a worker of this SDK), was given as ``human_output``.
- **review**: a guardrail with ``on_fail="human"`` that fails compiles (3.32.3) to a ``HUMAN`` task
  ``<agent>_guardrail_human[_<n>]__<turn>`` (its input: ``guardrail_name``, ``guardrail_message``,
  ``llm_output``), then an INLINE ``..._validate`` (reads ``approved``, ``edited_output``,
  ``reason`` from the answer), a model call only when the answer is free text (never for this
  SDK's answers), and an INLINE ``..._process`` whose ``{action: approve|edit|reject, result,
  reason}`` the run routes on: ``approve`` keeps the answer, ``edit`` makes ``result`` the run's
  output, ``reject`` ends the run FAILED with ``reason``. ``approved: true`` approves even with an
  ``edited_output``; an edit is ``approved: false`` with ``edited_output``.

Every answer this SDK sends carries an ``answer_id``. The server takes answers to a task without
compare-and-set, so when two race, the one the run went on with (the process task's input for an
approval, the JOIN's output for a question) is the winner.

Pure functions over the server's JSON and immutable values; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from .._common.answer_text import answer_text
from .._common.task_names import PICK_SUFFIX, SELECTION_SUFFIX, is_message_wait
from ..result import SERVER_INPUT_KEYS

__all__ = ["HumanAnswer", "PendingRequest", "PendingToolCall", "approval_decision", "consumed_answer",
           "is_review_task", "pending_in", "request_kind", "stored_answer", "waits_on_person"]

HUMAN = "HUMAN"
APPROVAL_MARK = "_approval_human"
REVIEW_MARK = "_guardrail_human"
#: Keys of a HUMAN task's input that describe the form, not the model's question.
_FORM_KEYS = frozenset({"__humanTaskDefinition", "response_schema", "response_ui_schema", "_description"})
#: Keys this SDK adds to an answer.
ANSWER_ID, ANSWERED_BY, DECISION, REJECTED = "answer_id", "answered_by", "decision", "rejected"


def _freeze(value: Any) -> Mapping[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@attrs.frozen
class PendingToolCall:
    """One tool call a person is asked about: the tool and the model's arguments."""

    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}


@attrs.frozen
class PendingRequest:
    """A run waiting for a person: what waits (the run), for whom (``kind``), about what.

    ``kind`` is :attr:`APPROVAL` (tool calls to approve or reject, ``tool_calls``),
    :attr:`QUESTION` (a :class:`~conductor_agents.HumanTool` call; ``question`` is its text) or
    :attr:`REVIEW` (an answer of the model that failed a guardrail with ``on_fail="human"``:
    ``output`` is that answer, ``guardrail`` the guardrail's name, ``guardrail_message`` why it
    failed; approve, edit with ``respond(corrected)``, or reject).
    ``since`` is when the run started waiting (epoch seconds, the server's clock). ``options``: the
    answers a question takes, when it takes only some (a ``manual`` team's pick: the sub-agents'
    names; answer with one of them). Immutable; thread-safe.

    ``execution_id`` is the id callers hold for the run: a continued listener's mailbox (or first
    run), the same for every request of the listener across its switches; pass it to ``approve`` and
    the other verbs. ``run_execution_id`` is the run of the listener that holds the request (None when
    that is ``execution_id`` itself); :attr:`held_in` is whichever it is.
    """

    APPROVAL: ClassVar[str] = "approval"
    QUESTION: ClassVar[str] = "question"
    REVIEW: ClassVar[str] = "review"

    execution_id: str
    kind: str
    task_id: str
    task_reference_name: str
    tool_calls: tuple[PendingToolCall, ...] = ()
    since: float | None = None
    options: tuple[str, ...] = ()
    output: str | None = None
    guardrail: str | None = None
    guardrail_message: str | None = None
    run_execution_id: str | None = None

    @property
    def held_in(self) -> str:
        """The execution id of the run that holds the request."""
        return self.run_execution_id or self.execution_id

    def known_as(self, listener_id: str) -> PendingRequest:
        """This request named by the id callers hold for its listener (``listener_id``)."""
        if listener_id == self.execution_id:
            return self
        return attrs.evolve(self, execution_id=listener_id, run_execution_id=self.held_in)

    @property
    def tool_name(self) -> str | None:
        """The (first) tool the request is about."""
        return self.tool_calls[0].name if self.tool_calls else None

    @property
    def arguments(self) -> Mapping[str, Any]:
        """The (first) tool call's arguments."""
        return self.tool_calls[0].arguments if self.tool_calls else {}

    @property
    def question(self) -> str | None:
        """The question a :class:`HumanTool` call asks (None for an approval)."""
        if self.kind != self.QUESTION:
            return None
        value = self.arguments.get("question")
        return str(value) if value is not None else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``conductor-agents pending --json`` prints)."""
        out = {"executionId": self.execution_id, "runExecutionId": self.held_in, "kind": self.kind,
               "taskId": self.task_id,
               "taskReferenceName": self.task_reference_name, "question": self.question,
               "toolCalls": [c.to_dict() for c in self.tool_calls], "since": self.since,
               "options": list(self.options)}
        if self.kind == self.REVIEW:
            out.update(output=self.output, guardrail=self.guardrail, guardrailMessage=self.guardrail_message)
        return out

    @classmethod
    def from_task(cls, task: Mapping[str, Any], execution_id: str) -> PendingRequest | None:
        """The request an IN_PROGRESS HUMAN task stands for (None for any other task)."""
        if str(task.get("taskType")) != HUMAN or str(task.get("status")) != "IN_PROGRESS" or is_message_wait(task):
            return None  # (a listener's wait for messages on a HUMAN task is no request to a person)
        inputs = _freeze(task.get("inputData"))
        ref = str(task.get("referenceTaskName") or "")
        started = task.get("startTime") or task.get("scheduledTime")
        common: dict[str, Any] = {
            "execution_id": execution_id, "task_id": str(task.get("taskId") or ""), "task_reference_name": ref,
            "since": started / 1000.0 if isinstance(started, (int, float)) and started > 0 else None}
        if is_approval_task(task):
            calls = tuple(_tool_call(c) for c in inputs.get("tool_calls") or () if isinstance(c, Mapping))
            return cls(kind=cls.APPROVAL, tool_calls=calls, **common)
        if is_pick_task(task):
            options = _pick_options(inputs)
            question = f"Which agent should answer next: {', '.join(options)}?"
            call = PendingToolCall(str(task.get("taskDefName") or ref),
                                   {"question": question, "conversation": inputs.get("conversation")})
            return cls(kind=cls.QUESTION, tool_calls=(call,), options=options, **common)
        if is_review_task(task):
            return cls(kind=cls.REVIEW, output=answer_text(inputs.get("llm_output")) or None,
                       guardrail=_opt_str(inputs.get("guardrail_name")),
                       guardrail_message=_opt_str(inputs.get("guardrail_message")), **common)
        name = str(inputs.get("_agent_tool_name") or inputs.get("method") or task.get("taskDefName") or "")
        arguments = {k: v for k, v in inputs.items() if k not in SERVER_INPUT_KEYS and k not in _FORM_KEYS}
        return cls(kind=cls.QUESTION, tool_calls=(PendingToolCall(name, arguments),), **common)


def _tool_call(call: Mapping[str, Any]) -> PendingToolCall:
    arguments = call.get("inputParameters") if "inputParameters" in call else call.get("input")
    arguments = {k: v for k, v in _freeze(arguments).items() if k not in SERVER_INPUT_KEYS}
    return PendingToolCall(str(call.get("name") or ""), arguments)


def is_pick_task(task: Mapping[str, Any]) -> bool:
    """Whether a HUMAN task is a ``manual`` team's pick of its next sub-agent."""
    return (str(task.get("taskType")) == HUMAN and PICK_SUFFIX in str(task.get("referenceTaskName") or "")
            and isinstance(_freeze(task.get("inputData")).get("agent_options"), Mapping))


def _pick_options(inputs: Mapping[str, Any]) -> tuple[str, ...]:
    """The sub-agents' names of a pick, in the server's order (``agent_options``: name → index)."""
    options = _freeze(inputs.get("agent_options"))

    def index(item: tuple[str, Any]) -> int:
        try:
            return int(item[1])
        except (TypeError, ValueError):
            return len(options)

    return tuple(str(name) for name, _ in sorted(options.items(), key=index))


def _selection_ref(pick_ref: str) -> str:
    """``X_pick_agent__2`` → ``X_process_selection__2`` (the worker task given the person's answer)."""
    base, _, rest = pick_ref.rpartition(PICK_SUFFIX)
    return f"{base}{SELECTION_SUFFIX}{rest}"


def is_approval_task(task: Mapping[str, Any]) -> bool:
    """Whether a HUMAN task is the approval gate of a turn (not a HumanTool call)."""
    return str(task.get("taskType")) == HUMAN and APPROVAL_MARK in str(task.get("referenceTaskName") or "")


def is_review_task(task: Mapping[str, Any]) -> bool:
    """Whether a HUMAN task is a guardrail's review of an answer (``on_fail="human"``)."""
    return str(task.get("taskType")) == HUMAN and REVIEW_MARK in str(task.get("referenceTaskName") or "")


def request_kind(task: Mapping[str, Any]) -> str:
    """The :class:`PendingRequest` kind a HUMAN task stands for."""
    if is_approval_task(task):
        return PendingRequest.APPROVAL
    if is_review_task(task):
        return PendingRequest.REVIEW
    return PendingRequest.QUESTION


def waits_on_person(status: Mapping[str, Any]) -> bool:
    """Whether a status (``GET /agent/{id}/status``) says the run waits on a HUMAN task.

    The server reports the HUMAN task's form (``response_schema``) or the calls to approve
    (``toolCalls``); a wait for a message has neither, unless it is itself a ``HUMAN`` task
    (``listener_wait="human"``): then only the run's tasks tell (:func:`pending_in` ignores such a wait).
    """
    pending = status.get("pendingTool")
    return bool(status.get("isWaiting")) and isinstance(pending, Mapping) and (
        pending.get("response_schema") is not None or bool(pending.get("toolCalls")))


def pending_in(workflow: Mapping[str, Any], execution_id: str) -> tuple[PendingRequest, ...]:
    """Every request the run waits on now, oldest first (nothing once the run has ended)."""
    if str(workflow.get("status") or "RUNNING") not in ("RUNNING", "PAUSED"):
        return ()
    tasks = sorted((t for t in workflow.get("tasks") or () if isinstance(t, Mapping)),
                   key=lambda t: int(t.get("seq") or 0))
    found = (PendingRequest.from_task(t, execution_id) for t in tasks)
    return tuple(r for r in found if r is not None)


# --- answers ---------------------------------------------------------------------------------


@attrs.frozen
class HumanAnswer:
    """An answer a run went on with (or, for the loser of a race, the one it went on with instead).

    For an approval ``approved`` is True or False and ``reason`` the reviewer's note; for a question
    ``answer`` is the answer; for a review ``action`` is ``"approve"``, ``"edit"`` (``answer`` is the
    corrected output) or ``"reject"`` (``reason``), and ``approved`` is True only for ``"approve"``.
    ``answer_id`` tells answers apart (None for one sent without this SDK,
    e.g. from the Conductor UI). ``execution_id`` and ``run_execution_id`` name the listener and the
    run that held the request as on :class:`PendingRequest`. Immutable; thread-safe.
    """

    execution_id: str
    task_reference_name: str
    kind: str
    answer_id: str | None = None
    approved: bool | None = None
    reason: str | None = None
    answer: Any = None
    answered_by: str | None = None
    action: str | None = None
    run_execution_id: str | None = None

    @property
    def held_in(self) -> str:
        """The execution id of the run that held the request."""
        return self.run_execution_id or self.execution_id

    def known_as(self, listener_id: str) -> HumanAnswer:
        """This answer named by the id callers hold for its listener (``listener_id``)."""
        if listener_id == self.execution_id:
            return self
        return attrs.evolve(self, execution_id=listener_id, run_execution_id=self.held_in)


    def to_dict(self) -> dict[str, Any]:
        out = {"executionId": self.execution_id, "runExecutionId": self.held_in,
               "taskReferenceName": self.task_reference_name,
               "kind": self.kind, "answerId": self.answer_id, "approved": self.approved, "reason": self.reason,
               "answer": self.answer, "answeredBy": self.answered_by}
        if self.action is not None:
            out["action"] = self.action
        return out


def _approval_answer(result: Mapping[str, Any], execution_id: str, ref: str) -> HumanAnswer:
    extra = _freeze(result.get("extra"))
    approved = result.get("approved") is True and extra.get(DECISION) != REJECTED
    return HumanAnswer(execution_id=execution_id, task_reference_name=ref, kind=PendingRequest.APPROVAL,
                       answer_id=_opt_str(extra.get(ANSWER_ID)), approved=approved,
                       reason=_opt_str(result.get("reason")), answered_by=_opt_str(extra.get(ANSWERED_BY)))


def _question_answer(output: Mapping[str, Any], execution_id: str, ref: str) -> HumanAnswer:
    if "answer" in output:
        answer = output["answer"]
    else:  # answered without this SDK: the whole output is the answer
        answer = {k: v for k, v in output.items() if k not in (ANSWER_ID, ANSWERED_BY)}
    return HumanAnswer(execution_id=execution_id, task_reference_name=ref, kind=PendingRequest.QUESTION,
                       answer_id=_opt_str(output.get(ANSWER_ID)), answer=answer,
                       answered_by=_opt_str(output.get(ANSWERED_BY)))


def _review_answer(action: Any, answer: Any, reason: Any, human_output: Mapping[str, Any], execution_id: str,
                   ref: str) -> HumanAnswer:
    action = str(action) if action in ("approve", "edit", "reject") else "reject"
    return HumanAnswer(execution_id=execution_id, task_reference_name=ref, kind=PendingRequest.REVIEW,
                       answer_id=_opt_str(human_output.get(ANSWER_ID)), approved=action == "approve",
                       reason=_opt_str(reason) if action == "reject" else _opt_str(human_output.get("reason")),
                       answer=answer if action == "edit" else None,
                       answered_by=_opt_str(human_output.get(ANSWERED_BY)), action=action)


def _stored_review_action(output: Mapping[str, Any]) -> str:
    """What the server's review scripts make of an answer (approved wins over an edit)."""
    approved = output.get("approved")
    if isinstance(approved, str):
        approved = approved.strip().lower() in ("true", "yes", "y")
    if approved is True:
        return "approve"
    return "edit" if output.get("edited_output") else "reject"


def _opt_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _process_ref(human_ref: str, step: str = "process") -> str:
    """``X_approval_human__3`` → ``X_approval_human_process__3`` (the INLINE the run routes on)."""
    base, sep, turn = human_ref.rpartition("__")
    return f"{base}_{step}__{turn}" if sep and turn.isdigit() else f"{human_ref}_{step}"


def consumed_answer(workflow: Mapping[str, Any], human: Mapping[str, Any]) -> HumanAnswer | None:
    """The answer the run went on with for HUMAN task ``human``; None while it has not yet."""
    execution_id = str(workflow.get("workflowId") or human.get("workflowInstanceId") or "")
    ref = str(human.get("referenceTaskName") or "")
    tasks = [t for t in workflow.get("tasks") or () if isinstance(t, Mapping)]
    if is_approval_task(human):
        wanted = _process_ref(ref)
        for task in tasks:
            if task.get("referenceTaskName") == wanted and task.get("status") == "COMPLETED":
                return _approval_answer(_freeze(_freeze(task.get("outputData")).get("result")), execution_id, ref)
        return None
    if is_pick_task(human):
        wanted = _selection_ref(ref)
        for task in tasks:
            given = _freeze(task.get("inputData")).get("human_output")
            if task.get("referenceTaskName") == wanted and isinstance(given, Mapping):
                return _question_answer(_freeze(given), execution_id, ref)
        return None
    if is_review_task(human):
        processed = next((t for t in tasks if t.get("referenceTaskName") == _process_ref(ref)
                          and t.get("status") == "COMPLETED"), None)
        if processed is None:
            return None
        validate = next((t for t in tasks if t.get("referenceTaskName") == _process_ref(ref, "validate")), None)
        human_output = _freeze(_freeze((validate or {}).get("inputData")).get("human_output"))
        result = _freeze(_freeze(processed.get("outputData")).get("result"))
        return _review_answer(result.get("action"), result.get("result"), result.get("reason"), human_output,
                              execution_id, ref)
    for task in tasks:
        if task.get("taskType") == "JOIN" and task.get("status") == "COMPLETED":
            joined = _freeze(task.get("outputData")).get(ref)
            if isinstance(joined, Mapping):
                output = joined.get("_agent_tool_output", joined)
                return _question_answer(_freeze(output), execution_id, ref)
    return None


def stored_answer(human: Mapping[str, Any], execution_id: str) -> HumanAnswer | None:
    """The answer stored on HUMAN task ``human`` (None while it waits)."""
    if str(human.get("status")) != "COMPLETED":
        return None
    output = _freeze(human.get("outputData"))
    ref = str(human.get("referenceTaskName") or "")
    if is_approval_task(human):
        extra = {k: v for k, v in output.items() if k not in ("approved", "reason")}
        return _approval_answer({"approved": output.get("approved") is True, "reason": output.get("reason"),
                                 "extra": extra}, execution_id, ref)
    if is_review_task(human):
        return _review_answer(_stored_review_action(output), output.get("edited_output"), output.get("reason"),
                              output, execution_id, ref)
    return _question_answer(output, execution_id, ref)


def approval_decision(tasks: Sequence[Mapping[str, Any]], execution_id: str,
                      before_seq: int) -> HumanAnswer | None:
    """The approval decision the run routed on for a tool task scheduled at ``before_seq``: the
    latest approval process task before it (None when there is none)."""
    latest: tuple[int, Mapping[str, Any]] | None = None
    for task in tasks:
        ref = str(task.get("referenceTaskName") or "")
        seq = int(task.get("seq") or 0)
        if f"{APPROVAL_MARK}_process" in ref and task.get("status") == "COMPLETED" and seq < before_seq and (
                latest is None or seq > latest[0]):
            latest = (seq, task)
    if latest is None:
        return None
    ref = str(latest[1].get("referenceTaskName") or "").replace("_process", "", 1)
    return _approval_answer(_freeze(_freeze(latest[1].get("outputData")).get("result")), execution_id, ref)
