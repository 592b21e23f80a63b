"""A listener's stop in the order of its messages, and a ``stop()`` that returns at once.

The rule (``docs/concepts.md``, *Stop and cancel*): a listener's messages and its stop are handled in the order the
server accepted them; every message accepted before the stop is read by the listener's model before the run ends.
The server's stop alone breaks it: ``POST /agent/{id}/stop`` sets a flag the loop reads at the end of each
iteration, so set while the listener waits, the loop ends right after the wait that takes in a message sent just
before the stop, and no model reads that message.

So ``stop()`` of a continued listener (:func:`stop_listener_in_order`), a few requests, never a wait for a turn:

- **at rest** (its newest run waits for messages, nothing else in flight, and no message this process sent it is
  still queued), pulled from the run's own queue: the flag, then the stop message (which wakes the wait). Nothing
  was accepted before that the model has not read: no model turn reads the stop, as ever.
- **otherwise**, and always for a listener that waits on a ``HUMAN`` task: only the stop message, sent as any
  message is, so it goes behind every message accepted before it (across switches, from any process); this
  process's tools of the run see ``ctx.stop_requested`` at once. The process that serves the listener sets the
  flag as the stop reaches the model: the forward of a ``HUMAN`` wait before it completes a wait whose batch begins
  with the stop (:mod:`.handover`: the loop ends after that wait, no model turn reads the stop); the turn task
  before a model turn that reads a batch holding it (:func:`stop_if_read`: the model reads the messages before
  the stop, and the stop; the run ends after that turn's tool calls).

Where the stop lives until then: the stop message itself, on the server (the listener's queue or mailbox, a wait's
output, a switch's carried-over messages), never only in a process. A serving process that dies before it set the
flag leaves the message where it was: whoever serves the listener next (an adoption, ``resume()``) reads it at the
same point and sets the flag. A message sent after the stop is not acted on, and ``wait_delivered()`` says so.

A run that is no continued listener has no serving process that sees its turns: it is stopped as before (the flag,
then the stop message when it waits for messages), ending after its current turn.
Pure functions over the API; thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._common.task_names import HUMAN_TASK_TYPE, MESSAGE_WAIT_TASK_TYPE, is_message_wait
from .._wire.api import ConductorApi
from ..errors import ExecutionNotRunningError, MessageQueueDisabledError, MessageQueueFullError, RunPausedError
from ..result import RunStatus, stop_requested
from .carryover import pulled_message_ids
from .control import RunCallback, flag_stop, stop_listener
from .directory import Chain, ChainDirectory, Link
from .naming import names_errors
from .stop_flag import holds_stop, post_stop_flag, stop_in_digest

__all__ = ["at_rest", "stop_if_read", "stop_listener_in_order", "stop_run", "turn_reads_messages"]

log = logging.getLogger("conductor_agents.handle")

#: Tasks that are in progress while a run waits for messages and does nothing else (the loop, the join around the
#: wait, the dynamic fork that made it).
_RESTING = frozenset({"DO_WHILE", "JOIN", "FORK", "FORK_JOIN_DYNAMIC"})
#: The types of a model's tool call that may be a wait for messages (a ``HUMAN`` one may be a person's question too).
_WAIT_CALLS = frozenset({MESSAGE_WAIT_TASK_TYPE, HUMAN_TASK_TYPE})


def resting(tasks: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a run whose tasks in progress (or scheduled) are ``tasks`` waits for messages and does nothing
    else: a wait for messages among them, and every other one the loop, a fork or a join."""
    found = False
    for task in tasks:
        if is_message_wait(task):
            found = True
        elif str(task.get("taskType")) not in _RESTING:
            return False
    return found


def at_rest(api: ConductorApi, execution_id: str) -> bool:
    """Whether run ``execution_id`` waits for messages with nothing else in flight (no model turn, no tool). One
    small request.

    Raises: as :meth:`ConductorApi.workflow_tasks`.
    """
    page = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS", "SCHEDULED"), start=0, count=50)
    return resting(page.tasks)


def _queued_here(api: ConductorApi, link: Link, sent_here: list[str]) -> bool:
    """Whether a message this process sent to ``link`` is not among the messages it pulled (still in its queue: a
    waiting run's pull is evaluated about once a second)."""
    if not sent_here:
        return False
    variables = api.workflow_status(link.execution_id, include_variables=True).get("variables") or {}
    pulled = set(pulled_message_ids(variables, ()))
    return any(message_id not in pulled for message_id in sent_here)


@names_errors
def stop_listener_in_order(api: ConductorApi, directory: ChainDirectory, chain: Chain, *,
                           send_stop: Callable[[], str], on_stop: RunCallback) -> None:
    """Stop the continued listener ``chain`` in the order of its messages, without waiting (the module's steps).

    Raises:
        ExecutionNotFoundError: the server does not know the execution.
        ServerUnavailableError, ServerError: a request failed.
    """
    box = chain if chain.mailbox else directory.anchor(chain, cached=True)
    newest = directory.refresh(chain)
    if not box.human_wait and at_rest(api, newest.execution_id) \
            and not _queued_here(api, newest, directory.accepted_at(newest)):
        _stop_at_once(lambda: flag_stop(api, newest, on_stop), chain, send_stop=send_stop)
        return
    try:
        send_stop()
    except ExecutionNotRunningError:
        return  # ended: nothing to stop
    except (MessageQueueDisabledError, MessageQueueFullError, RunPausedError) as err:
        log.info("listener %s: no stop message sent (%s); stopped after its current turn", chain.execution_id, err)
        stop_listener(api, directory, chain, on_stop)
        return
    if on_stop is not None:  # this process's tools of the listener see ctx.stop_requested at once
        for number in range(max(chain.first, newest.number - 1), newest.number + 1):  # and a run a switch drains
            on_stop(chain.link(number).execution_id)


def _stop_at_once(flag: Callable[[], bool], chain: Chain, *, send_stop: Callable[[], str]) -> None:
    """The flag, then the stop message that wakes a wait (nobody reads it)."""
    if not flag():
        return
    try:
        send_stop()
    except (ExecutionNotRunningError, MessageQueueDisabledError, MessageQueueFullError, RunPausedError) as err:
        log.debug("no stop message pushed to %s: %s", chain.execution_id, err)


def stop_run(api: ConductorApi, directory: ChainDirectory, chain: Chain, *, takes_messages: bool | None,
             send_stop: Callable[[], str], on_stop: RunCallback) -> None:
    """Stop the run ``chain`` names: a continued listener in the order of its messages; any other run after its
    current turn (with the stop message when it may wait for messages: ``takes_messages`` True or None).

    Raises:
        ExecutionNotFoundError: the server does not know the execution.
        ServerUnavailableError, ServerError: a request failed.
    """
    if chain.continuable:
        stop_listener_in_order(api, directory, chain, send_stop=send_stop, on_stop=on_stop)
    elif takes_messages is False:
        stop_listener(api, directory, chain, on_stop)
    else:
        _stop_at_once(lambda: stop_listener(api, directory, chain, on_stop), chain, send_stop=send_stop)


# -- the serving process's side: the turn task ------------------------------------------------------------------


def turn_reads_messages(tool_calls: Any) -> bool:
    """Whether a model turn whose previous turn made ``tool_calls`` (the turn task's input) may read messages: that
    turn called a wait for messages (of either kind)."""
    return isinstance(tool_calls, list) and any(
        isinstance(call, Mapping) and str(call.get("type")) in _WAIT_CALLS for call in tool_calls)


def stop_if_read(api: ConductorApi, execution_id: str, *, tool_calls: Any,
                 carried: Iterable[Any] = (), pause: Callable[[float], Any] = lambda s: None) -> bool:
    """Run by the turn task before a model turn of run ``execution_id``: when the messages that turn reads hold the
    stop (a wait of the turn before took it in, or a switch carried it over: ``carried``, the new run's pending
    messages at its first turn), set the run's flag now, before the model call (whose end writes back the run it
    read), so the loop ends after this turn's tool calls. Whether it did. One request when the turn before called a
    wait, none otherwise.

    Raises: as :func:`~.stop_flag.post_stop_flag`.
    """
    found = holds_stop(carried)
    if not found and turn_reads_messages(tool_calls):
        workflow = api.workflow_status(execution_id, include_variables=True)
        if RunStatus.parse(workflow.get("status")).is_terminal or stop_requested(workflow):
            return False
        found = stop_in_digest(workflow.get("variables") or {})
    if not found:
        return False
    log.info("run %s: its model reads the stop message now; it ends after this turn", execution_id)
    return post_stop_flag(api, execution_id, pause=pause)

