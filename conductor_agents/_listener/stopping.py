"""A listener's stop finishes what it accepted: the stop is handled in the order of its messages.

The rule (``docs/concepts.md``, *Stop and cancel*): a run's messages and its stop are handled in the order the
server accepted them, so every message accepted before ``stop()`` is read by the listener's model before the run
ends, across switches and whichever process stops it; the run ends after the model's turn that reads the stop.

Why the server's stop alone breaks it: ``POST /agent/{id}/stop`` sets the run's ``_stop_requested``, which the
agent's loop reads at the end of each iteration. Set while the listener waits, it ends the loop as soon as the wait
completes, so what that wait took in (a message sent just before the stop) is in the run's task list and no model
reads it (3.32.3: ``send_message(); stop()`` ended COMPLETED, the message never acted on, 3 times of 3).

So a stop of a run that takes messages is, in order:

1. the stop message (``{"_signal": "stop"}``), sent as any message is (to the mailbox, or the newest run): every
   message accepted before it comes before it in the listener's order, across switches;
2. (this process's tools of the run see ``ctx.stop_requested`` at once, so a long tool may end early;) wait
   (bounded, :data:`REACH_SECONDS`) until the listener's newest run has taken it in (a completed wait holds
   it, or a switch carried it over) *and began the model turn after that wait*, the one that reads it;
3. the server's stop flag on that run, posted once no model call of it is in flight (a model call's end writes back
   the run it read at its start, which undoes a variable set meanwhile) and read back, posted again if undone: the
   loop ends after that turn's tool calls;
4. the stop message again: it wakes a wait the last turn may have called (nobody reads that one).

A run that does not take the stop in within :data:`REACH_SECONDS` (a long tool, or no process serves it) gets the
flag at once: it ends after its current turn, as a stop did before, and ``wait_delivered()`` tells the sender of a
message it had not read (:mod:`.delivery`). A run that cannot take messages (no wait tool, paused, queue full)
gets the flag at once. Pure functions over the API; thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .._common.clock import Clock
from .._common.task_names import MESSAGE_WAIT_MARK, MESSAGE_WAIT_TASK_TYPE
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import (
    ConductorAgentsError,
    ExecutionNotRunningError,
    MessageQueueDisabledError,
    MessageQueueFullError,
    RunPausedError,
)
from ..result import RunStatus, stop_requested
from .carryover import pulled_message_ids
from .control import stop_listener
from .directory import Chain, ChainDirectory, Link
from .naming import names_errors
from .reading import iteration_of, locate_wait, model_read_after
from .signals import settle_turn
from .switch import read_commit

__all__ = ["REACH_SECONDS", "post_stop", "stop_in_order", "stop_run"]

log = logging.getLogger("conductor_agents.handle")

#: How long a stop waits for the listener to take its stop message in before it stops the run at once.
REACH_SECONDS = 30.0
#: Pause between two looks at the listener while it has not taken the stop in.
_LOOK_EVERY = 0.25
#: Posts of the flag that a model call's write-back undid, before giving up (the stop message still ends it).
_FLAG_ATTEMPTS = 4
#: After a post, the flag is read back this much later.
_READ_BACK_AFTER = 0.2

RunCallback = Callable[[str], None] | None


def _has_wait(api: ConductorApi, execution_id: str) -> bool:
    """Whether run ``execution_id`` has a wait for messages (of either kind): one read of its definition."""
    definition = api.get_workflow(execution_id, include_tasks=False).get("workflowDefinition")
    text = repr(definition)
    return MESSAGE_WAIT_TASK_TYPE in text or MESSAGE_WAIT_MARK in text


def _taken_in(api: ConductorApi, directory: ChainDirectory, chain: Chain, message_id: str) -> tuple[Link, str]:
    """The listener's newest run and where it is with ``message_id``: ``"ended"``, ``"read"`` (it began the model
    turn after the wait that took it in, or after the switch that carried it over), or ``"not yet"``."""
    newest = directory.refresh(chain) if chain.continuable else chain.link(chain.first)
    status = api.workflow_status(newest.execution_id, include_variables=True)
    if RunStatus.parse(status.get("status")).is_terminal:
        return newest, "ended"
    if message_id in pulled_message_ids(status.get("variables") or {}, ()):
        wait = locate_wait(api, newest.execution_id, message_id)
        if wait is not None and model_read_after(api, newest.execution_id, iteration_of(wait)):
            return newest, "read"
        return newest, "not yet"
    if newest.number > chain.first:  # taken in by the run before and carried over by the switch
        record, _ = read_commit(api, newest)
        if record is not None and message_id in {str(p.get("id")) for p in record.pending} \
                and model_read_after(api, newest.execution_id, 0):
            return newest, "read"
    return newest, "not yet"


def post_stop(api: ConductorApi, execution_id: str, *, on_stop: RunCallback, pause: Callable[[float], Any],
              clock: Clock) -> bool:
    """Set the server's stop flag of run ``execution_id`` and see that it stuck; False when the run has ended.

    Posted once no model call of the run is in flight, read back, and posted again when a model call's write-back
    undid it (a few times; the stop message in its queue ends a run whose flag never stuck).
    """
    told = False
    for _ in range(_FLAG_ATTEMPTS):
        settle_turn(api, execution_id, pause=pause, clock=clock)
        try:
            api.stop_agent(execution_id)
        except HttpError as err:
            if err.status != 409:
                raise
            return told
        if on_stop is not None and not told:  # this process's running tools see ctx.stop_requested at once
            on_stop(execution_id)
        told = True
        pause(_READ_BACK_AFTER)
        workflow = api.workflow_status(execution_id, include_variables=True)
        if RunStatus.parse(workflow.get("status")).is_terminal or stop_requested(workflow):
            return True
        log.info("run %s: its stop flag was undone by the server; posting it again", execution_id)
    log.warning("run %s: its stop flag did not stick after %d posts; the stop message ends it", execution_id,
                _FLAG_ATTEMPTS)
    return True


@names_errors
def stop_in_order(api: ConductorApi, directory: ChainDirectory, chain: Chain, *, send_stop: Callable[[], str],
                  on_stop: RunCallback, clock: Clock, pause: Callable[[float], Any],
                  reach_seconds: float = REACH_SECONDS) -> None:
    """Stop the listener ``chain`` in the order of its messages (the module's steps 1-4).

    ``send_stop()`` sends the stop message as ``send_message`` does and returns its id. ``pause(s)`` returning True
    (this process is closing) ends the wait for the listener: it is stopped at once.

    Raises:
        ExecutionNotFoundError: the server does not know the execution.
        ServerUnavailableError, ServerError: a request failed.
    """
    try:
        message_id: str | None = send_stop()
    except ExecutionNotRunningError:
        return  # ended: nothing to stop
    except (MessageQueueDisabledError, MessageQueueFullError, RunPausedError) as err:
        log.info("listener %s: no stop message sent (%s); stopped after its current turn", chain.execution_id, err)
        message_id = None
    newest = directory.refresh(chain) if chain.continuable else chain.link(chain.first)
    if message_id is not None and on_stop is not None:  # a tool running here may end early: the stop is reached sooner
        for number in range(max(chain.first, newest.number - 1), newest.number + 1):  # and the run a switch drains
            on_stop(chain.link(number).execution_id)
    if message_id is not None:
        deadline = clock.monotonic() + reach_seconds
        while True:
            newest, where = _taken_in(api, directory, chain, message_id)
            if where == "ended":
                return
            if where == "read":
                break
            if clock.monotonic() >= deadline:
                log.warning("listener %s: it did not take its stop message in within %.0fs (busy, or not served); "
                            "stopped after its current turn: a message it has not read is not acted on",
                            chain.execution_id, reach_seconds)
                break
            if pause(_LOOK_EVERY):
                break  # this process is closing
    if not post_stop(api, newest.execution_id, on_stop=on_stop, pause=pause, clock=clock) or message_id is None:
        return
    try:  # wakes a wait the last turn called; nobody reads it
        send_stop()
    except ConductorAgentsError as err:
        log.debug("listener %s: no second stop message (%s)", chain.execution_id, err)


def stop_run(api: ConductorApi, directory: ChainDirectory, chain: Chain, *, takes_messages: bool | None,
             send_stop: Callable[[], str], on_stop: RunCallback, clock: Clock, pause: Callable[[float], Any]) -> None:
    """Stop the run ``chain`` names: in the order of its messages when it takes messages (``takes_messages``, or
    None: a continued listener does, another run when its definition has a wait), else after its current turn.

    Raises:
        ExecutionNotFoundError: the server does not know the execution.
        ServerUnavailableError, ServerError: a request failed.
    """
    if takes_messages is None:
        takes_messages = chain.continuable or _has_wait(api, chain.execution_id)
    if takes_messages:
        stop_in_order(api, directory, chain, send_stop=send_stop, on_stop=on_stop, clock=clock, pause=pause)
    else:
        stop_listener(api, directory, chain, on_stop)
