"""Ending, pausing and unpausing a run, or every run of a continued listener that may still be running.

A continued listener has, besides its newest run, the run before it while a switch is under way, and
its mailbox (the id callers hold). Each verb here reaches the ones it must:

- stop: the newest run only. The switch ends the run before it, and the server's stop
  (``POST /agent/{id}/stop``) writes back the whole run it read, without a lock: racing an end of the
  same run, it can bring that run back RUNNING (seen on 3.32.3 in about 1 of 30 races).
- cancel: every live run, read back and ended again when such a stop brought it back; then the mailbox.
- pause: the mailbox first (a sender pushing to the listener's id then gets 409 at once, nothing is
  accepted that the listener cannot take), then every live run (a switch under way keeps both paused:
  its new run is committed paused and takes no turn until unpaused).
- unpause: the runs, then the mailbox. Both are idempotent, and both hold across a switch racing them: pause()
  looks again for a newer run once it has paused, and a switch whose run was paused as it began pauses its new run
  before it ends the old one (``Switch.keep_paused``).

Pausing uses the server's own ``PUT /workflow/{id}/pause``: the run schedules nothing new (no model
turn), tasks already handed out still finish, and a push into it answers 409 (``RunPausedError``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import MODEL_TASK_TYPE
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ExecutionNotRunningError
from ..result import RunStatus
from .directory import Chain, ChainDirectory, Link
from .following import end_mailbox, is_running, live_links, newest_link
from .naming import names_errors
from .pausing import pause_run, resume_run, run_status

__all__ = ["RunCallback", "cancel_listener", "flag_stop", "pause_listener", "stop_listener", "unpause_listener"]

log = logging.getLogger("conductor_agents.handle")

#: How long pause() waits for a model call under way (scheduled just before the pause) to end, and how often it looks.
_MODEL_CALL_WAIT_SECONDS = 60.0
_MODEL_CALL_LOOK_EVERY = 0.25

#: Rounds of a cancel: a switch racing it starts a newer run, a stop racing it brings one back.
_CANCEL_ROUNDS = 3

RunCallback = Callable[[str], None] | None


@names_errors
def stop_listener(api: ConductorApi, directory: ChainDirectory, chain: Chain, on_stop: RunCallback) -> bool:
    """Ask the newest run to finish after its current turn; whether a running run was asked."""
    return flag_stop(api, newest_link(directory, chain), on_stop)


def flag_stop(api: ConductorApi, link: Link, on_stop: RunCallback) -> bool:
    """Set the server's stop flag of ``link`` (this process's running tools of it see ``ctx.stop_requested`` at
    once); whether it was running."""
    try:
        api.stop_agent(link.execution_id)
    except HttpError as err:
        if err.status != 409:
            raise
        return False
    if on_stop is not None:
        on_stop(link.execution_id)
    return True


@names_errors
def cancel_listener(api: ConductorApi, directory: ChainDirectory, chain: Chain, reason: str,
                    on_ended: RunCallback) -> None:
    """End every live run at once (TERMINATED), then the listener's mailbox."""
    cancelled: set[str] = set()
    for _ in range(_CANCEL_ROUNDS):
        links = [link for link in live_links(api, directory, chain)
                 if link.execution_id not in cancelled or is_running(api, link.execution_id)]
        if not links:
            break
        for link in links:
            try:
                api.cancel_agent(link.execution_id, reason)
            except HttpError as err:
                if err.status != 409:
                    raise
            cancelled.add(link.execution_id)
            if on_ended is not None:  # its tools running here see ctx.cancelled at once
                on_ended(link.execution_id)
    end_mailbox(api, directory, chain)  # later pushes to the listener's id answer 409


@names_errors
def pause_listener(api: ConductorApi, directory: ChainDirectory, chain: Chain, *, clock: Clock = SYSTEM_CLOCK,
                   pause: Callable[[float], Any] = time.sleep) -> None:
    """Pause the mailbox, then every live run; return once no model call of theirs is under way.

    A paused run is decided no more, but a model call the server scheduled just before the pause (a turn that began
    as it came) still runs: so pause() waits for it to end (up to :data:`_MODEL_CALL_WAIT_SECONDS`), and once it
    returns no model call comes until :func:`unpause_listener` (the turn's tool calls are scheduled then).

    Raises:
        ExecutionNotRunningError: the run (the listener) has ended.
        ExecutionNotFoundError: the server does not know the execution.
    """
    if chain.mailbox:  # first: no push is accepted that the listener cannot take
        _pause(api, chain.execution_id, chain.execution_id)
    newest, *before = live_links(api, directory, chain)
    _pause(api, newest.execution_id, chain.execution_id)
    for link in before:  # a switch under way: the run before may end meanwhile (its switch ends it)
        pause_run(api, link.execution_id)
    latest = newest_link(directory, chain)
    if latest.number > newest.number:
        # A switch began as the runs were read: its new run is paused too. One that begins after this look finds
        # the run it continues paused and pauses its new run itself (Switch.keep_paused).
        pause_run(api, latest.execution_id)
        before, newest = [newest, *before], latest
    _let_model_calls_end(api, [newest, *before], clock=clock, pause=pause)


def _let_model_calls_end(api: ConductorApi, links: list[Link], *, clock: Clock,
                         pause: Callable[[float], Any]) -> None:
    deadline = clock.monotonic() + _MODEL_CALL_WAIT_SECONDS
    while True:
        calls = [t for link in links
                 for t in api.workflow_tasks(link.execution_id, statuses=("SCHEDULED", "IN_PROGRESS"), start=0,
                                             count=50).tasks
                 if t.get("taskType") == MODEL_TASK_TYPE]
        if not calls:
            return
        if clock.monotonic() >= deadline:
            log.warning("listener %s paused, but a model call of run %s has not ended after %.0fs; it may still "
                        "answer", links[0].execution_id, calls[0].get("workflowInstanceId"), _MODEL_CALL_WAIT_SECONDS)
            return
        pause(_MODEL_CALL_LOOK_EVERY)


@names_errors
def unpause_listener(api: ConductorApi, directory: ChainDirectory, chain: Chain) -> None:
    """Unpause every live run that is paused, then the mailbox; runs not paused are left as they are.

    Raises:
        ExecutionNotRunningError: the run (the listener) has ended.
        ExecutionNotFoundError: the server does not know the execution.
    """
    links = live_links(api, directory, chain)
    statuses = [(link.execution_id, run_status(api, link.execution_id)) for link in links]
    if all(status.is_terminal for _, status in statuses):
        raise ExecutionNotRunningError(f"run {chain.execution_id} has ended; there is nothing to unpause",
                                       execution_id=chain.execution_id)
    for execution_id, status in statuses:
        if status is RunStatus.PAUSED:
            resume_run(api, execution_id)
    # A switch that found the run it continues paused as it was read pauses its new run (Switch.keep_paused), then
    # looks again: it resumes the new run itself when it sees the old one resumed, else this second look sees it.
    for link in live_links(api, directory, chain):
        resume_run(api, link.execution_id)
    if chain.mailbox:
        resume_run(api, chain.execution_id)


def _pause(api: ConductorApi, execution_id: str, held_as: str) -> None:
    try:
        api.pause_workflow(execution_id)
    except HttpError as err:
        if err.status != 409:
            raise
        raise ExecutionNotRunningError(f"run {held_as} has ended; it cannot be paused", execution_id=held_as,
                                       ) from err
