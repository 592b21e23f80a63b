"""Whether a listener's model read a message: the model turn after the wait that took it in (pure reading).

A wait for messages (of either kind) completes inside one iteration of the agent's loop; its messages reach the
model at the model turn of a later iteration. A run that ends right after the wait (its loop ended: the stop flag,
the turn limit, a cancel) took the messages in, and no model read them. So "acted on" is: the run began a model
turn of a later iteration than the wait's (or, for a message a switch carried over, its new run began one), and
the message was not behind a stop signal in that wait's output (the model reads the stop first: what follows it
is not acted on).
Used by the stop (:mod:`.stopping`) and the delivery checks (:mod:`.delivery`). Thread-safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._common.task_names import MODEL_TASK_TYPE, is_message_wait
from .._wire.api import ConductorApi
from ..result import STOP_SIGNAL

__all__ = ["after_stop", "held_by", "iteration_of", "locate_wait", "model_read_after", "read_after"]

#: Tasks read per page, from the end of a run.
_PAGE = 50
_ITERATION = re.compile(r"__(\d+)$")


def iteration_of(task: Mapping[str, Any]) -> int:
    """The loop iteration a task of the agent's loop belongs to (0 outside the loop)."""
    value = task.get("iteration")
    if isinstance(value, int) and value > 0:
        return value
    match = _ITERATION.search(str(task.get("referenceTaskName") or ""))
    return int(match.group(1)) if match else 0


def held_by(task: Mapping[str, Any], message_id: str) -> bool:
    """Whether ``task`` is a completed wait for messages whose output holds ``message_id``."""
    if not is_message_wait(task):
        return False
    output = task.get("outputData")
    messages = output.get("messages") if isinstance(output, Mapping) else None
    return isinstance(messages, list) and any(isinstance(m, Mapping) and str(m.get("id")) == message_id
                                              for m in messages)


def after_stop(task: Mapping[str, Any], message_id: str) -> bool:
    """Whether the wait ``task`` took ``message_id`` in behind a stop signal (the model reads the stop first, and a
    listener told to stop does not act on what follows it)."""
    output = task.get("outputData")
    for message in (output.get("messages") if isinstance(output, Mapping) else None) or ():
        if not isinstance(message, Mapping):
            continue
        if str(message.get("id")) == message_id:
            return False
        if message.get("payload") == STOP_SIGNAL:
            return True
    return False


def read_after(tasks: Sequence[Mapping[str, Any]], iteration: int) -> bool | None:
    """Whether a model turn of a later iteration than ``iteration`` is among ``tasks`` (the end of a run's task
    list, in order): True; False when the tasks reach back to ``iteration`` without one; None when they do not
    reach back that far (look at the page before)."""
    for task in reversed(tasks):
        number = iteration_of(task)
        if not number:
            continue  # outside the loop (the tasks after it, in an ended run)
        if number <= iteration:
            return False
        if task.get("taskType") == MODEL_TASK_TYPE:
            return True
    return None


def model_read_after(api: ConductorApi, execution_id: str, iteration: int) -> bool:
    """Whether run ``execution_id`` began a model turn after loop iteration ``iteration`` (pages from its end).

    Raises: as :meth:`ConductorApi.workflow_tasks`.
    """
    start = api.workflow_tasks(execution_id, start=0, count=1).total
    while start > 0:
        start = max(0, start - _PAGE)
        verdict = read_after(api.workflow_tasks(execution_id, start=start, count=_PAGE).tasks, iteration)
        if verdict is not None:
            return verdict
    return False


def locate_wait(api: ConductorApi, execution_id: str, message_id: str) -> Mapping[str, Any] | None:
    """The wait for messages of run ``execution_id`` that took ``message_id`` in: pages of finished tasks, newest
    first (one or two requests for a recent message).

    Raises: as :meth:`ConductorApi.workflow_tasks`.
    """
    start = api.workflow_tasks(execution_id, statuses=("COMPLETED",), start=0, count=1).total
    while start > 0:
        start = max(0, start - _PAGE)
        for task in api.workflow_tasks(execution_id, statuses=("COMPLETED",), start=start, count=_PAGE).tasks:
            if held_by(task, message_id):
                return task
    return None
