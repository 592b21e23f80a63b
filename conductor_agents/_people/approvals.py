"""Answering a run that waits for a person: ``approve``, ``reject``, ``respond``, and ``pending``.

Any process can answer, by execution id: nothing here needs the process that serves the run.
An answer completes the run's ``HUMAN`` task (``POST /tasks``, the same update
``POST /agent/{id}/respond`` makes, aimed at one task) with the answer and an ``answer_id``, then
reads the run back until it has gone on with an answer (see :mod:`conductor_agents._people.pending` for
where that shows), so the caller learns whether its answer is the one the run took:

- the run took it: the :class:`HumanAnswer` is returned;
- another answer got there first (the task was answered already, or two answers raced: the
  server has no compare-and-set on tasks, so both updates may be accepted): the loser gets
  :class:`AnswerConflictError` with the winner.

A question answered while other tool calls of its turn still run shows in the turn's JOIN only
once they finish: then the answer stored on the task decides, after :data:`SETTLE_SECONDS` (any
racing update has landed by then; the server applies an update within one request). An approval
is taken at once (the server routes on it in the same request), so only the run decides it.

A listener that is being continued has two runs at once (see ``docs/humans.md``): the old one,
drained before it ends, may still wait for a person while the new one takes the messages. Every
verb takes the runs ``earlier`` than ``execution_id`` that may still hold a request, oldest first;
``pending`` lists what all of them wait on, and an answer goes to the run that holds its request
(the oldest that does, unless ``request`` names one). The runs are read once, and that read both
picks the run and the task the answer completes, so an answer is sent to one task of one run.

Stateless functions over a :class:`ConductorApi`; thread-safe.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._common.checks import A_TIMEOUT
from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.json_check import json_copy
from .._wire.api import ConductorApi
from ..errors import (
    AnswerConflictError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    InvalidAnswerError,
    NothingPendingError,
    PayloadError,
    WaitTimeoutError,
)
from ..result import RunStatus
from .pending import (
    ANSWER_ID,
    ANSWERED_BY,
    DECISION,
    REJECTED,
    HumanAnswer,
    PendingRequest,
    consumed_answer,
    pending_in,
    request_kind,
    stored_answer,
    waits_on_person,
)

__all__ = ["approve", "pending", "pending_of_agent", "reject", "respond"]

#: How long an answer waits for the run to go on with an answer, by default.
DEFAULT_CONFIRM_SECONDS = 30.0
#: Between samples of the run while confirming.
_SAMPLE_SECONDS = 0.25
#: A question whose turn's JOIN has not completed by then is decided by the answer stored on the task.
SETTLE_SECONDS = 3.0

Target = PendingRequest | str | None
#: A run as read for an answer: its execution id and its workflow with tasks.
Run = tuple[str, Mapping[str, Any]]


def pending(api: ConductorApi, execution_id: str, *, earlier: Sequence[str] = ()) -> tuple[PendingRequest, ...]:
    """What run ``execution_id`` (and the runs ``earlier``, of the same listener) waits on from a
    person now, oldest first (one request per run; an earlier run gone from the server is skipped).

    Raises:
        ExecutionNotFoundError: ``execution_id`` is unknown.
    """
    return pending_of_runs(_read_runs(api, execution_id, earlier))


def pending_of_runs(runs: Sequence[Run]) -> tuple[PendingRequest, ...]:
    """What the runs (read oldest first) wait on, each request once."""
    found: dict[str, PendingRequest] = {}
    for execution_id, workflow in runs:
        for request in pending_in(workflow, execution_id):
            found.setdefault(request.task_id, request)
    return tuple(found.values())


def _read_runs(api: ConductorApi, execution_id: str, earlier: Sequence[str]) -> list[Run]:
    """The runs ``earlier`` (oldest first) and ``execution_id``, each read once with its tasks."""
    runs: list[Run] = []
    for run in dict.fromkeys(r for r in earlier if r != execution_id):
        try:
            runs.append((run, api.get_workflow(run, include_tasks=True)))
        except ExecutionNotFoundError:
            continue  # removed from the server since: it holds nothing any more
    runs.append((execution_id, api.get_workflow(execution_id, include_tasks=True)))
    return runs


def pending_of_agent(api: ConductorApi, agent_name: str) -> tuple[PendingRequest, ...]:
    """What every running run of agent ``agent_name`` waits on from a person, oldest first.

    One ``GET /workflow/running/{name}``, one status per running run, and one task-list read per
    run that waits on a person: a page of an approval queue, not something to call in a loop.
    """
    found: dict[str, PendingRequest] = {}
    for execution_id in dict.fromkeys(api.running_workflow_ids(agent_name)):
        try:
            status = api.agent_status(execution_id)
            if waits_on_person(status):
                for request in pending(api, execution_id):
                    found.setdefault(request.task_id, request)
        except ExecutionNotFoundError:
            continue  # ended and cleaned up in between
    return tuple(sorted(found.values(), key=lambda r: (r.since or 0.0, r.execution_id)))


def approve(api: ConductorApi, execution_id: str, *, reason: str | None = None, by: str | None = None,
            request: Target = None, timeout: float = DEFAULT_CONFIRM_SECONDS, clock: Clock = SYSTEM_CLOCK,
            pause: Callable[[float], Any] | None = None, earlier: Sequence[str] = ()) -> HumanAnswer:
    """Approve the tool calls run ``execution_id`` waits on (they run, in the process serving the
    run), or the answer a guardrail holds for review (it leaves the run as it is)."""
    reason = optional_text(reason, "reason")

    def payload(kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {"approved": True}
        if kind != PendingRequest.REVIEW:
            out[DECISION] = "approved"
        if reason:
            out["reason"] = reason
        return out

    return _answer(api, execution_id, (PendingRequest.APPROVAL, PendingRequest.REVIEW), payload, by=by,
                   request=request, timeout=timeout, clock=clock, pause=pause, earlier=earlier)


def reject(api: ConductorApi, execution_id: str, reason: str, *, by: str | None = None,
           request: Target = None, timeout: float = DEFAULT_CONFIRM_SECONDS, clock: Clock = SYSTEM_CLOCK,
           pause: Callable[[float], Any] | None = None, earlier: Sequence[str] = ()) -> HumanAnswer:
    """Reject the tool calls: none of them runs; the model sees the rejection and ``reason``, and the
    run goes on. Sent as ``approved: true`` with ``decision: "rejected"``: the server ends the whole
    run on ``approved: false`` (see :mod:`conductor_agents._people.pending`).

    Reject an answer a guardrail holds for review: the server ends the run FAILED with ``reason``
    as its error (3.32.3 offers no other outcome of a rejected review).
    """
    text = required_reason(reason)

    def payload(kind: str) -> dict[str, Any]:
        if kind == PendingRequest.REVIEW:
            return {"approved": False, "reason": text}
        return {"approved": True, DECISION: REJECTED, "reason": text}

    return _answer(api, execution_id, (PendingRequest.APPROVAL, PendingRequest.REVIEW), payload, by=by,
                   request=request, timeout=timeout, clock=clock, pause=pause, earlier=earlier)


def respond(api: ConductorApi, execution_id: str, answer: Any, *, by: str | None = None,
            request: Target = None, timeout: float = DEFAULT_CONFIRM_SECONDS, clock: Clock = SYSTEM_CLOCK,
            pause: Callable[[float], Any] | None = None, earlier: Sequence[str] = ()) -> HumanAnswer:
    """Answer the question run ``execution_id`` asks: the model gets ``{"answer": answer, ...}``.

    A question with ``options`` (a ``manual`` team's pick of its next sub-agent) takes one of them
    (a sub-agent's name, or the Agent). To an answer a guardrail holds for review, ``answer`` (a
    non-empty str) is the corrected answer: it becomes the run's output instead of the model's.

    Raises:
        InvalidAnswerError: the answer is not one of the question's ``options``.
    """
    if hasattr(answer, "to_config") and isinstance(getattr(answer, "name", None), str):
        answer = answer.name  # an Agent, picked for a manual team
    try:
        value = json_copy(answer)
    except TypeError as err:
        raise PayloadError(f"the answer must be JSON: {err}") from None

    def payload(kind: str) -> dict[str, Any]:
        if kind == PendingRequest.REVIEW:
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"the corrected answer of a guardrail review must be a non-empty str, got {value!r}")
            return {"approved": False, "edited_output": value}
        return {"answer": value}

    return _answer(api, execution_id, (PendingRequest.QUESTION, PendingRequest.REVIEW), payload, by=by,
                   request=request, timeout=timeout, clock=clock, pause=pause, earlier=earlier)


def optional_text(value: Any, name: str) -> str | None:
    """A ``reason``/``by`` argument: None or a stripped str (blank counts as None).

    Raises:
        TypeError: not a str.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, got {value!r}")
    return value.strip() or None


def required_reason(reason: Any) -> str:
    """The reason of a rejection: the model reads it, so it must say something.

    Raises:
        ValueError: blank or not a str.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"reject() needs a reason the model can read, got {reason!r}")
    return reason.strip()


# --- the protocol ----------------------------------------------------------------------------


def _answer(api: ConductorApi, execution_id: str, kinds: tuple[str, ...], payload: Callable[[str], dict[str, Any]], *,
            by: str | None, request: Target, timeout: float, clock: Clock,
            pause: Callable[[float], Any] | None, earlier: Sequence[str] = ()) -> HumanAnswer:
    timeout = float(A_TIMEOUT.check("timeout", timeout))
    by = optional_text(by, "by")
    wait = pause if pause is not None else threading.Event().wait
    runs = _read_runs(api, execution_id, earlier)
    execution_id, workflow = holder(runs, kinds, request)
    if request is not None:
        _raise_if_answered(workflow, execution_id, request)  # told even when the run has ended since
    _check_running(workflow, execution_id)
    target = _target(workflow, execution_id, kinds, request, runs=runs)
    body = payload(target.kind)
    if target.options:
        body = _picked(body, target)
    answer_id = uuid.uuid4().hex[:16]
    output = {**body, ANSWER_ID: answer_id}
    if by:
        output[ANSWERED_BY] = str(by)
    api.update_task({"workflowInstanceId": execution_id, "taskId": target.task_id, "status": "COMPLETED",
                     "outputData": output})
    winner = _confirm(api, execution_id, target, timeout=timeout, clock=clock, pause=wait)
    if winner.answer_id == answer_id:
        return winner
    raise _conflict(execution_id, target.task_reference_name, answer_id, winner)


def _picked(payload: dict[str, Any], target: PendingRequest) -> dict[str, Any]:
    """The answer to a question with ``options`` (a manual team's pick): one of them, also sent as
    ``selected`` (the field of the server's own form).

    Raises:
        InvalidAnswerError: the answer is not one of the options (nothing is sent).
    """
    answer = payload.get("answer")
    if not isinstance(answer, str) or answer.strip() not in target.options:
        raise InvalidAnswerError(f"run {target.execution_id} asks which agent answers next; the answer must be one "
                                 f"of {list(target.options)}, got {answer!r}", execution_id=target.execution_id,
                                 answer=answer, options=target.options)
    return {**payload, "answer": answer.strip(), "selected": answer.strip()}


def _check_running(workflow: Mapping[str, Any], execution_id: str) -> None:
    status = RunStatus.parse(workflow.get("status"))
    if status.is_terminal:
        raise ExecutionNotRunningError(
            f"run {execution_id} has ended ({status.value}); nothing waits for an answer",
            execution_id=execution_id)


def holder(runs: Sequence[Run], kinds: tuple[str, ...], request: Target) -> Run:
    """The run an answer goes to, of ``runs`` (read oldest first; the last is the listener's current run).

    The oldest running run that waits on ``request`` (or, without one, on a request of ``kinds``);
    else the oldest running run that waits on a person at all (it tells the caller what it waits
    for); else, for a named ``request``, the run that holds it answered or ended (it tells who won);
    else the current run (it tells that nothing waits, and what was answered last).
    """
    def waiting(run: Run) -> tuple[PendingRequest, ...]:
        return pending_in(run[1], run[0])

    if isinstance(request, PendingRequest):
        named = [run for run in runs if run[0] == request.held_in]
        if named:
            return named[0]
    for run in runs:
        if any(_matches(found, request) if request is not None else found.kind in kinds for found in waiting(run)):
            return run
    for run in runs:
        if waiting(run):
            return run
    if request is not None:
        for run in runs:
            if any(_matches_task(task, request) and task.get("taskType") == "HUMAN" for task in _tasks(run[1])):
                return run
    return runs[-1]


def _matches(found: PendingRequest, request: Target) -> bool:
    wanted = request.task_id if isinstance(request, PendingRequest) else str(request)
    return wanted in (found.task_id, found.task_reference_name)


def _matches_task(task: Mapping[str, Any], request: Target) -> bool:
    wanted = request.task_id if isinstance(request, PendingRequest) else str(request)
    return wanted in (task.get("taskId"), task.get("referenceTaskName"))


def _tasks(workflow: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [t for t in workflow.get("tasks") or () if isinstance(t, Mapping)]


def _target(workflow: Mapping[str, Any], execution_id: str, kinds: tuple[str, ...],
            request: Target, *, runs: Sequence[Run] = ()) -> PendingRequest:
    """The pending request to answer (the oldest of ``kinds`` unless ``request`` names one).

    Raises:
        NothingPendingError: nothing of ``kinds`` waits (or ``request`` names none of the run's tasks).
        AnswerConflictError: ``request`` was answered already.
    """
    waiting = pending_in(workflow, execution_id)
    if request is not None:
        wanted = request.task_id if isinstance(request, PendingRequest) else str(request)
        for found in waiting:
            if wanted in (found.task_id, found.task_reference_name):
                if found.kind not in kinds:
                    raise _wrong_kind(execution_id, kinds, found.kind)
                return found
        _raise_if_answered(workflow, execution_id, request)
        raise NothingPendingError(f"run {execution_id} has no pending request {wanted!r}",
                                  execution_id=execution_id, expected=kinds[0])
    of_kind = [r for r in waiting if r.kind in kinds]
    if of_kind:
        return of_kind[0]
    if waiting:
        raise _wrong_kind(execution_id, kinds, waiting[0].kind)
    last = None
    for run_id, run in reversed([*runs] or [(execution_id, workflow)]):  # the newest run's latest answer
        last = _last_answer(run, run_id, kinds)
        if last is not None:
            break
    told = ""
    if last is not None:
        who = f" by {last.answered_by}" if last.answered_by else ""
        told = f"; the latest request, {last.task_reference_name}, was answered{who}"
    verb = "answer" if PendingRequest.QUESTION in kinds else "approve"
    raise NothingPendingError(
        f"run {execution_id} waits for no person now (nothing to {verb}){told}", execution_id=execution_id,
        expected=kinds[0], last_answer=last)


def _last_answer(workflow: Mapping[str, Any], execution_id: str,
                 kinds: tuple[str, ...]) -> HumanAnswer | None:
    """The answer the run took for its latest request of ``kinds`` (None when it had none)."""
    humans = [t for t in workflow.get("tasks") or () if t.get("taskType") == "HUMAN"
              and t.get("status") == "COMPLETED" and request_kind(t) in kinds]
    if not humans:
        return None
    latest = max(humans, key=lambda t: int(t.get("seq") or 0))
    return consumed_answer(workflow, latest) or stored_answer(latest, execution_id)


def _raise_if_answered(workflow: Mapping[str, Any], execution_id: str, request: Target) -> None:
    """Raise AnswerConflictError when ``request`` names a HUMAN task that already has an answer."""
    wanted = request.task_id if isinstance(request, PendingRequest) else str(request)
    for task in workflow.get("tasks") or ():
        if wanted in (task.get("taskId"), task.get("referenceTaskName")) and task.get("taskType") == "HUMAN":
            winner = consumed_answer(workflow, task) or stored_answer(task, execution_id)
            if winner is not None:
                raise _conflict(execution_id, str(task.get("referenceTaskName")), None, winner)


_WHAT = {PendingRequest.APPROVAL: "an approval", PendingRequest.QUESTION: "an answer to a question",
         PendingRequest.REVIEW: "a review of an answer a guardrail stopped"}
_USE = {PendingRequest.APPROVAL: "approve() or reject()", PendingRequest.QUESTION: "respond()",
        PendingRequest.REVIEW: "approve(), respond(corrected_answer) or reject()"}


def _wrong_kind(execution_id: str, kinds: tuple[str, ...], other: str) -> NothingPendingError:
    return NothingPendingError(
        f"run {execution_id} waits for {_WHAT.get(other, other)}, not for "
        f"{' or '.join(_WHAT.get(k, k) for k in kinds)}: use {_USE.get(other, 'another answer')}",
        execution_id=execution_id, expected=kinds[0], waiting_for=other)


def _conflict(execution_id: str, ref: str, answer_id: str | None, winner: HumanAnswer) -> AnswerConflictError:
    if winner.kind == PendingRequest.APPROVAL:
        what = "approved" if winner.approved else "rejected"
    elif winner.kind == PendingRequest.REVIEW:
        what = {"approve": "approved", "edit": f"edited to {winner.answer!r}"}.get(str(winner.action), "rejected")
    else:
        what = f"answered {winner.answer!r}"
    who = f" by {winner.answered_by}" if winner.answered_by else ""
    return AnswerConflictError(
        f"run {execution_id}: another answer won ({what}{who}); the run goes on with it, not with this one",
        execution_id=execution_id, task_reference_name=ref, answer_id=answer_id or "", winner=winner)


def _confirm(api: ConductorApi, execution_id: str, target: PendingRequest, *, timeout: float,
             clock: Clock, pause: Callable[[float], Any]) -> HumanAnswer:
    """The answer the run went on with, read back from the server (bounded by ``timeout``)."""
    started = clock.monotonic()
    deadline = started + timeout
    while True:
        workflow = api.get_workflow(execution_id, include_tasks=True)
        human = next((t for t in workflow.get("tasks") or () if t.get("taskId") == target.task_id), None)
        if human is None:
            raise ExecutionNotRunningError(f"run {execution_id} no longer holds request {target.task_reference_name}",
                                           execution_id=execution_id)
        consumed = consumed_answer(workflow, human)
        if consumed is not None:
            return consumed
        stored = stored_answer(human, execution_id)
        if str(human.get("status")) in ("CANCELED", "SKIPPED", "FAILED", "TIMED_OUT") or (
                stored is None and RunStatus.parse(workflow.get("status")).is_terminal):
            raise ExecutionNotRunningError(
                f"run {execution_id} ended ({workflow.get('status')}) before it took an answer to "
                f"{target.task_reference_name}", execution_id=execution_id)
        now = clock.monotonic()
        if stored is not None and target.kind == PendingRequest.QUESTION and now - started >= SETTLE_SECONDS:
            return stored  # its turn's other tool calls still run; the stored answer is what the run reads
        if now >= deadline:
            if stored is not None and target.kind == PendingRequest.QUESTION:
                return stored
            raise WaitTimeoutError(
                f"run {execution_id} did not take an answer to {target.task_reference_name} within {timeout:g}s "
                "(the answer was sent; it may still be taken)", execution_id=execution_id, timeout=timeout)
        pause(min(_SAMPLE_SECONDS, max(0.0, deadline - now)))
