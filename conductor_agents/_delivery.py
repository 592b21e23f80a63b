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
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

import attrs

from ._api import ConductorApi
from ._clock import Clock
from ._transport import HttpError
from .errors import MessageLostError, ServerUnavailableError, WaitTimeoutError

__all__ = ["MessageDelivery", "DeliveryCheck", "wait_for_delivery"]

log = logging.getLogger("conductor_agents.delivery")

#: The server's task type of a wait-for-message call.
PULL_TASK_TYPE = "PULL_WORKFLOW_MESSAGES"
_TERMINAL_RUN = frozenset({"COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"})
#: Evaluations after the first sample that prove one of them started after the push.
_EVALUATIONS_FOR_PROOF = 2


@attrs.frozen
class MessageDelivery:
    """Where a message went: the wait-for-message task of the run that pulled it."""

    execution_id: str
    message_id: str
    task_reference_name: str
    task_id: str
    received_at: Optional[str] = None  # when the server accepted it (its clock, ISO-8601)
    batch_count: int = 1  # how many messages that task pulled at once


def _pull_tasks(workflow: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return (t for t in workflow.get("tasks") or () if isinstance(t, Mapping) and t.get("taskType") == PULL_TASK_TYPE)


def find_delivery(workflow: Mapping[str, Any], execution_id: str, message_id: str) -> Optional[MessageDelivery]:
    """The delivery of ``message_id`` in the run's task list, if a task pulled it."""
    for task in _pull_tasks(workflow):
        output = task.get("outputData") or {}
        messages = output.get("messages") if isinstance(output, Mapping) else None
        for message in messages or ():
            if isinstance(message, Mapping) and str(message.get("id")) == message_id:
                return MessageDelivery(
                    execution_id=execution_id, message_id=message_id,
                    task_reference_name=str(task.get("referenceTaskName") or ""),
                    task_id=str(task.get("taskId") or ""),
                    received_at=message.get("receivedAt"), batch_count=len(messages),
                )
    return None


class DeliveryCheck:
    """Reads successive samples of one run (``GET /workflow/{id}?includeTasks=true``) for one message.

    Every sample must be taken after the server accepted the message. :meth:`observe` returns
    the delivery, raises :class:`MessageLostError`, or returns None (not known yet). Not
    thread-safe: one waiter owns it.
    """

    def __init__(self, execution_id: str, message_id: str) -> None:
        self.execution_id = execution_id
        self.message_id = message_id
        self._first_poll_count: Dict[str, int] = {}
        self._suspect = False

    def observe(self, workflow: Mapping[str, Any]) -> Optional[MessageDelivery]:
        """One sample. Raises MessageLostError when the message can no longer arrive."""
        delivery = find_delivery(workflow, self.execution_id, self.message_id)
        if delivery is not None:
            return delivery
        status = str(workflow.get("status") or "")
        if status in _TERMINAL_RUN:
            raise MessageLostError(
                f"message {self.message_id} was not delivered: run {self.execution_id} ended {status} "
                "without pulling it (a run's queue is deleted when it ends)",
                execution_id=self.execution_id, message_id=self.message_id,
                reason=MessageLostError.RUN_ENDED, run_status=status,
            )
        if self._suspect:  # the second sample in a row without it: confirmed
            raise MessageLostError(
                f"message {self.message_id} is no longer on the server: run {self.execution_id} waited "
                "for messages and found its queue empty after the message was accepted, and no task "
                "pulled it. The server lost it (on a SQLite server the message queue is in memory and "
                "a server restart empties it); send it again",
                execution_id=self.execution_id, message_id=self.message_id,
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
            if count >= first + _EVALUATIONS_FOR_PROOF:
                log.debug("run %s: task %s evaluated %d times while %s was missing", self.execution_id,
                          task.get("referenceTaskName"), count - first, self.message_id)
                return True
        return False


def wait_for_delivery(
    api: ConductorApi,
    execution_id: str,
    message_id: str,
    *,
    timeout: float,
    interval: float,
    max_transient_errors: int,
    clock: Clock,
    pause: Callable[[float], Any],
) -> MessageDelivery:
    """Sample the run every ``interval`` seconds until ``message_id`` is delivered or lost.

    ``pause(seconds)`` waits between samples (an Event's ``wait``). Transient errors are
    tolerated up to ``max_transient_errors`` in a row, as ``wait()`` does.

    Raises:
        MessageLostError: the message can no longer arrive.
        WaitTimeoutError: ``timeout`` passed first; the message may still arrive.
        ExecutionNotFoundError: the server does not know the execution.
        ServerUnavailableError, ServerError: too many transient errors, or another one.
    """
    check = DeliveryCheck(execution_id, message_id)
    deadline = clock.monotonic() + timeout
    errors = 0
    while True:
        try:
            workflow = api.get_workflow(execution_id, include_tasks=True)
            errors = 0
        except (ServerUnavailableError, HttpError) as err:
            if isinstance(err, HttpError) and not err.transient:
                raise
            errors += 1
            if errors > max_transient_errors:
                raise
            log.info("sampling run %s failed (%s); %d consecutive transient errors", execution_id, err, errors)
            workflow = None
        if workflow is not None:
            delivery = check.observe(workflow)
            if delivery is not None:
                return delivery
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            raise WaitTimeoutError(
                f"message {message_id} was not pulled by run {execution_id} within {timeout:g}s; it may "
                "still arrive (the run has not waited for messages since, or not long enough to tell)",
                execution_id=execution_id, timeout=timeout,
            )
        pause(min(interval, remaining))
