"""Checking that a message reached its run: ``wait_delivered()`` and how a loss is told.

The server keeps no record of a message once a run has pulled it, except in the run's task
list: every ``PULL_WORKFLOW_MESSAGES`` task (a :class:`~conductor_agents.WaitForMessageTool`
call) completes with ``{messages: [{id, payload, receivedAt, ...}], count}``, and the tasks of
earlier loop iterations stay in the list. So a message was delivered when its id is in one of
those outputs.

A message can no longer arrive when

- the run ended without pulling it (the server deletes a run's queue when the run ends), or
- the run is waiting and its queue is empty. A waiting ``PULL_WORKFLOW_MESSAGES`` task is
  re-evaluated by the server about once a second; each evaluation pops up to ``batchSize``
  messages and completes the task if it got any, so an evaluation that leaves the task waiting
  saw an empty queue. Once such an evaluation *started* after the message was accepted, the
  message is neither queued nor pulled: it is gone (on a SQLite server the queue is in the
  server's memory and a restart empties it; a Redis queue also drops messages past its TTL).
  The server counts evaluations in the task's ``pollCount`` and persists it when an evaluation
  ends; two more than first seen after the push proves one started after it. The verdict is
  confirmed by one more sample (a second wait-for-message task of the same turn may have
  popped the message and not yet written its output).

Nothing here waits for ever: every wait has a deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from .._common.clock import Clock
from .._common.task_names import MESSAGE_WAIT_TASK_TYPE, is_message_wait
from .._common.transient import TransientErrors
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ExecutionNotFoundError, MessageLostError, ServerUnavailableError, WaitTimeoutError
from .carryover import pulled_message_ids
from .directory import Chain, ChainDirectory, Link
from .naming import names_errors, run_name
from .stop_flag import behind_stop
from .switch import EVALUATIONS_SINCE, read_commit

__all__ = ["MessageDelivery", "DeliveryCheck", "wait_for_delivery"]

log = logging.getLogger("conductor_agents.delivery")

#: The server's task type of a wait-for-message call.
PULL_TASK_TYPE = MESSAGE_WAIT_TASK_TYPE
_TERMINAL_RUN = frozenset({"COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"})


@attrs.frozen
class MessageDelivery:
    """Where a message went: the wait-for-message task of the run that pulled it."""

    execution_id: str
    message_id: str
    task_reference_name: str
    task_id: str
    received_at: str | None = None  # when the server accepted it (its clock, ISO-8601)
    batch_count: int = 1  # how many messages that task pulled at once


def _pull_tasks(workflow: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return (t for t in workflow.get("tasks") or () if isinstance(t, Mapping) and is_message_wait(t))


def find_delivery(workflow: Mapping[str, Any], execution_id: str, message_id: str) -> MessageDelivery | None:
    """The delivery of ``message_id`` in the run's task list, if a task pulled it."""
    for task in _pull_tasks(workflow):
        output = task.get("outputData") or {}
        messages = output.get("messages") if isinstance(output, Mapping) else None
        if not messages:
            continue
        for message in messages:
            if isinstance(message, Mapping) and str(message.get("id")) == message_id:
                return MessageDelivery(
                    execution_id=execution_id, message_id=message_id,
                    task_reference_name=str(task.get("referenceTaskName") or ""),
                    task_id=str(task.get("taskId") or ""),
                    received_at=message.get("receivedAt"), batch_count=len(messages),
                )
    return None


class DeliveryCheck:
    """Reads successive samples of one run for one message. Every sample must be taken after the
    server accepted the message. :meth:`observe` returns the delivery, raises
    :class:`MessageLostError`, or returns None (not known yet). Not thread-safe: one waiter owns it.

    A sample is what the cheap reads give (``_sample``): the run's status, its tool-results digest
    (which lists every message the run pulled up to its last turn) and its unfinished tasks, plus
    the tasks after its last turn once it has ended; ``find`` locates the task that pulled a message.
    """

    def __init__(self, execution_id: str, message_id: str, *, reported_as: str | None = None) -> None:
        self.execution_id = execution_id
        self.message_id = message_id
        self._reported_as = reported_as or execution_id  # the id errors name (the one the caller holds)
        self._first_poll_count: dict[str, int] = {}
        self._suspect = False

    def observe(self, workflow: Mapping[str, Any]) -> MessageDelivery | None:
        """One sample (a workflow-shaped mapping: ``status``, ``tasks``). Raises MessageLostError when
        the message can no longer arrive."""
        delivery = find_delivery(workflow, self.execution_id, self.message_id)
        status = str(workflow.get("status") or "")
        if delivery is not None and any(behind_stop(t, self.message_id) for t in _pull_tasks(workflow)):
            raise MessageLostError(
                f"message {self.message_id} was not acted on: {run_name(self._reported_as, self.execution_id)} took "
                "it in behind its stop (a listener told to stop acts on what came before the stop, not after); "
                "send it again if it matters",
                execution_id=self._reported_as, message_id=self.message_id,
                reason=MessageLostError.NOT_ACTED_ON, run_status=status or None,
            )
        if delivery is not None:
            return delivery
        if status in _TERMINAL_RUN:
            raise MessageLostError(
                f"message {self.message_id} was not delivered: {run_name(self._reported_as, self.execution_id)} "
                f"ended {status} without pulling it (a run's queue is deleted when it ends)",
                execution_id=self._reported_as, message_id=self.message_id,
                reason=MessageLostError.RUN_ENDED, run_status=status,
            )
        if self._suspect:  # the second sample in a row without it: confirmed
            raise MessageLostError(
                f"message {self.message_id} is no longer on the server: "
                f"{run_name(self._reported_as, self.execution_id)} waited for messages and found its queue empty "
                "after the message was accepted, and no task pulled it. The server lost it (on a SQLite server "
                "the message queue is in memory and a server restart empties it); send it again",
                execution_id=self._reported_as, message_id=self.message_id,
                reason=MessageLostError.NOT_IN_QUEUE, run_status=status or None,
            )
        self._suspect = self._waited_on_an_empty_queue(workflow)
        return None

    def _waited_on_an_empty_queue(self, workflow: Mapping[str, Any]) -> bool:
        for task in _pull_tasks(workflow):
            task_id = str(task.get("taskId") or "")
            count = task.get("pollCount")
            if not task_id or not isinstance(count, int) or task.get("status") != "IN_PROGRESS":
                continue
            first = self._first_poll_count.setdefault(task_id, count)
            if count >= first + EVALUATIONS_SINCE:
                log.debug("run %s: task %s evaluated %d times while %s was missing", self.execution_id,
                          task.get("referenceTaskName"), count - first, self.message_id)
                return True
        return False


#: Tasks read from the end of an ended run (the wait-for-message tasks after its last merged turn).
_TAIL = 30


def _sample(api: ConductorApi, execution_id: str, message_id: str) -> Mapping[str, Any]:
    """A workflow-shaped sample from cheap reads: the PULL task that pulled ``message_id`` (located
    only once the digest says it was pulled), the unfinished tasks, and the tail of an ended run."""
    status = api.workflow_status(execution_id, include_variables=True)
    variables = status.get("variables") or {}
    run_status = str(status.get("status") or "")
    sample: dict[str, Any] = {"status": run_status, "tasks": []}
    if message_id in pulled_message_ids(variables, ()):
        located = _locate(api, execution_id, message_id)
        sample["tasks"] = [located] if located is not None else [_placeholder(execution_id, message_id)]
        return sample
    if run_status in _TERMINAL_RUN:
        total = api.workflow_tasks(execution_id, start=0, count=1).total
        sample["tasks"] = api.workflow_tasks(execution_id, start=max(0, total - _TAIL), count=_TAIL).tasks
        return sample
    sample["tasks"] = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS",), start=1, count=20).tasks
    return sample


def _locate(api: ConductorApi, execution_id: str, message_id: str) -> Mapping[str, Any] | None:
    """The wait-for-message task that pulled ``message_id``: pages of finished tasks, newest first."""
    total = api.workflow_tasks(execution_id, statuses=("COMPLETED",), start=0, count=1).total
    start = total
    while start > 0:
        start = max(0, start - 50)
        for task in api.workflow_tasks(execution_id, statuses=("COMPLETED",), start=start, count=50).tasks:
            if is_message_wait(task) and find_delivery({"tasks": [task]}, execution_id, message_id):
                return task
    return None


def _placeholder(execution_id: str, message_id: str) -> dict[str, Any]:
    # The digest says the run pulled it, but the task is not found (cannot happen on a sound server).
    return {"taskType": PULL_TASK_TYPE, "referenceTaskName": "", "taskId": "",
            "outputData": {"messages": [{"id": message_id, "workflowId": execution_id}]}}


def _continued_verdict(api: ConductorApi, chain: Chain, link: Link, message_id: str) -> MessageDelivery | None:
    """For a link that was continued: the message's delivery per the switch's record; raises
    MessageLostError when the switch dropped it; None while the switch is not committed."""
    successor = chain.link(link.number + 1)
    record, open_ = read_commit(api, successor)
    if record is None:
        if open_:
            return None
        raise MessageLostError(
            f"message {message_id} was not delivered: {run_name(chain.execution_id, link.execution_id)} ended "
            "without pulling it",
            execution_id=chain.execution_id, message_id=message_id, reason=MessageLostError.RUN_ENDED,
            run_status="TERMINATED")
    if message_id in {str(p.get("id")) for p in record.pending}:
        return MessageDelivery(execution_id=successor.execution_id, message_id=message_id,
                               task_reference_name="carried over", task_id="", batch_count=len(record.pending))
    if message_id in record.pulled:
        located = _locate(api, link.execution_id, message_id)
        found = find_delivery({"tasks": [located]}, link.execution_id, message_id) if located else None
        return found or MessageDelivery(execution_id=link.execution_id, message_id=message_id,
                                        task_reference_name="", task_id="")
    raise MessageLostError(
        f"message {message_id} was not delivered: {run_name(chain.execution_id, link.execution_id)} was "
        f"continued as {successor.execution_id} before it pulled the message (a run's queue is deleted when it "
        "ends); send it again (send_message does that itself for the messages it sends)",
        execution_id=chain.execution_id, message_id=message_id, reason=MessageLostError.RUN_ENDED,
        run_status="TERMINATED")


#: Runs of a listener looked at, newest first, for the one that took a message in.
_LOOK_BACK = 50


def _taken_by(api: ConductorApi, directory: ChainDirectory, chain: Chain, message_id: str) -> Link | None:
    """The run of the listener whose digest lists ``message_id`` (newest first; retired runs skipped), or None."""
    newest = directory.refresh(chain)
    for number in range(newest.number, max(chain.first, newest.number - _LOOK_BACK) - 1, -1):
        link = chain.link(number)
        try:
            variables = api.workflow_status(link.execution_id, include_variables=True).get("variables") or {}
        except ExecutionNotFoundError:
            continue
        if message_id in pulled_message_ids(variables, ()):
            return link
    return None


@names_errors
def wait_for_delivery(
    api: ConductorApi,
    directory: ChainDirectory,
    chain: Chain,
    message_id: str,
    *,
    timeout: float,
    interval: float,
    max_transient_errors: int,
    clock: Clock,
    pause: Callable[[float], Any],
) -> MessageDelivery:
    """Sample the listener every ``interval`` seconds until ``message_id`` is delivered or lost.

    The run that accepted the message is known when this process sent it; otherwise the listener's
    newest run is watched (and the one before it is looked at for the message once).
    ``pause(seconds)`` waits between samples (an Event's ``wait``). Transient errors are
    tolerated up to ``max_transient_errors`` in a row, as ``wait()`` does.

    Raises:
        MessageLostError: the message can no longer arrive.
        WaitTimeoutError: ``timeout`` passed first; the message may still arrive.
        ExecutionNotFoundError: the server does not know the execution.
        ServerUnavailableError, ServerError: too many transient errors, or another one.
    """
    link = directory.accepted_by(message_id)
    if link is None and chain.continuable:  # sent through the mailbox, or by another process: which run took it?
        link = _taken_by(api, directory, chain, message_id)
    if link is None:
        link = directory.refresh(chain) if chain.continuable else directory.newest(chain)
        if link.number > chain.first:  # sent by another process just before a switch?
            earlier = chain.link(link.number - 1)
            try:
                verdict = _continued_verdict(api, chain, earlier, message_id)
                if verdict is not None:
                    return verdict
            except (MessageLostError, ExecutionNotFoundError):
                pass  # not pulled by the earlier run (or it was retired): look in the newest
    # A listener on a HUMAN wait takes every message through its mailbox: one a run was continued without is handed
    # to a later run (the mailbox's forward), never dropped with that run.
    handed_on = chain.continuable and directory.anchor(chain, cached=True).human_wait
    check = DeliveryCheck(link.execution_id, message_id, reported_as=chain.execution_id)
    deadline = clock.monotonic() + timeout
    budget = TransientErrors(max_transient_errors)
    while True:
        try:
            sample: Mapping[str, Any] | None = _sample(api, link.execution_id, message_id)
            budget.ok()
        except (ServerUnavailableError, HttpError) as err:
            if not budget.tolerate(err):
                raise
            log.info("sampling run %s failed (%s); %d consecutive transient errors", link.execution_id, err,
                     budget.count)
            sample = None
        if sample is not None:
            if sample.get("status") in _TERMINAL_RUN and chain.continuable \
                    and find_delivery(sample, link.execution_id, message_id) is None \
                    and directory.exists(chain, link.number + 1):
                try:
                    verdict = _continued_verdict(api, chain, link, message_id)
                except MessageLostError:
                    if not handed_on:
                        raise
                    link = chain.link(link.number + 1)  # still in the mailbox when this run was continued
                    check = DeliveryCheck(link.execution_id, message_id, reported_as=chain.execution_id)
                    continue
                if verdict is not None:
                    return verdict
            else:
                delivery = check.observe(sample)
                if delivery is not None:
                    return delivery
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            raise WaitTimeoutError(
                f"message {message_id} was not pulled by "
                f"{run_name(chain.execution_id, link.execution_id, current=True)} within {timeout:g}s; it may still "
                "arrive (the run has not waited for messages since, or not long enough to tell)",
                execution_id=chain.execution_id, timeout=timeout,
            )
        pause(min(interval, remaining))
