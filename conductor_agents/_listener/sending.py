"""Sending a message to a listener that may be in the middle of a continuation (see
:mod:`conductor_agents._listener.switch`).

A message goes to the newest link this process knows. Once the server accepted it (``200``), one
small request asks whether a newer link exists; almost always it does not, and the message is in
the queue of the listener's current run. If a newer link exists, a switch has begun, and the old
link's queue is dropped when the switch ends: the message either reached the old run (it is acted
on there, or carried over to the new one) or it did not (then it is sent again, to the new run).
The switch's commit record says which (its ``pulled`` ids). A ``409`` from a link that was continued
sends the message to its successor. So every message this SDK sends reaches the listener once.

A sender that bypasses the SDK (``POST /workflow/{id}/messages`` itself) pushes to the listener's
mailbox (:mod:`.mailbox`), whose forward sends each message on through this function. A listener
without a mailbox (started before it, or ``Continuation(mailbox=False)``) answers such a sender ``409``
from a link that was continued, and a message it pushes to a link during the few seconds of its switch
can be dropped: see ``docs/operations.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import (
    FORWARD_TASK,
    MAILBOX_REST_TASK,
    MESSAGE_WAIT_TASK_TYPE,
    REST_SECONDS,
    is_message_wait,
)
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ConductorAgentsError, ExecutionNotFoundError, ExecutionNotRunningError, ServerUnavailableError
from ..result import RunStatus
from .carryover import pulled_message_ids
from .directory import Chain, ChainDirectory, Link
from .naming import named_for
from .switch import EVALUATIONS_SINCE, read_commit, read_final_state

__all__ = ["push_to_mailbox", "send_to_listener", "wake"]

log = logging.getLogger("conductor_agents.continuation")

#: Pause between two looks at a switch a message is caught in.
_COMMIT_POLL = 0.25
#: A continued run's final state is read for a message's fate only this long after it ended (a
#: wait-for-message task evaluated as it ended writes its output a moment later).
_FINAL_AFTER_SECONDS = 2.0
#: Pauses between the looks of one :func:`wake` that found the mailbox mid-round, with no forward: a pull that took
#: nothing just before the push shows as a rest (or, version 3, a ``WAIT``) within a few tens of ms, or seconds on a
#: loaded server; after the last pause, the wake goes on looking every second.
_WAKE_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)
#: How long one :func:`wake` goes on looking (and trying again after an error that may pass) before it leaves the
#: message to the serving process's next check, which can be minutes away while the mailbox is idle.
_WAKE_SECONDS = 15.0
#: A mailbox's rest is ended by a decide once it has rested this long (a second, with a margin for clocks apart).
_REST_ENDS_AFTER = REST_SECONDS + 0.2
#: Most times one message is sent again (each resend follows a switch that dropped it).
_MAX_ATTEMPTS = 50


def send_to_listener(api: ConductorApi, directory: ChainDirectory, execution_id: str, body: Mapping[str, Any], *,
                     switch_wait: float, clock: Clock, pause: Callable[[float], Any],
                     on_accepted: Callable[[str, Link], None] = lambda message_id, link: None) -> str:
    """Push ``body`` into the listener ``execution_id`` names; the message id of the copy that counts.

    ``switch_wait`` bounds how long a message caught in a switch waits for the switch's commit; past
    it the message id is returned as is (the switch's outcome decides its fate, and
    ``wait_delivered`` tells it) and a warning is logged.

    Raises:
        as :meth:`ConductorApi.push_message`; ExecutionNotRunningError when the listener has ended.
    """
    chain = directory.chain(execution_id)
    if not chain.continuable:
        return api.push_message(execution_id, body)
    box = chain if chain.mailbox else directory.anchor(chain, cached=True)
    if box.human_wait:  # every message goes through its mailbox, whose forward hands it to the wait
        return push_to_mailbox(api, box.execution_id, body, pause=pause)
    with named_for(chain):  # a run's error (full queue, paused) names the id the caller holds
        link = directory.newest(chain)
        for _ in range(_MAX_ATTEMPTS):
            try:
                message_id = api.push_message(link.execution_id, body)
            except (ExecutionNotRunningError, ExecutionNotFoundError) as err:
                if isinstance(err, ExecutionNotFoundError) and chain.held(link.number):
                    raise
                newer = directory.refresh(chain)  # continued, or retired since this process last looked
                if newer.number <= link.number:
                    if isinstance(err, ExecutionNotRunningError) and link.execution_id != execution_id:
                        raise ExecutionNotRunningError(  # the listener ended: say so by the id the caller holds
                            f"listener {execution_id} has ended (its run {link.execution_id} is not running); it "
                            "cannot receive messages", execution_id=execution_id) from err
                    raise
                link = newer
                continue
            on_accepted(message_id, link)
            if not directory.exists(chain, link.number + 1):
                return message_id
            # Link ``link`` is being (or was) continued: did the message reach it?
            reached = _fate(api, chain, link, message_id, switch_wait, clock, pause)
            if reached is not False:
                return message_id
            log.info("message %s was dropped with run %s's queue at a continuation; sending it again",
                     message_id, link.execution_id)
            link = directory.refresh(chain)
        raise ExecutionNotRunningError(
            f"listener {execution_id} was continued {_MAX_ATTEMPTS} times while one message was being sent; "
            "it was not delivered", execution_id=execution_id)


def wake(api: ConductorApi, mailbox_id: str, *, pause: Callable[[float], Any], clock: Clock = SYSTEM_CLOCK) -> bool:
    """Make sure mailbox ``mailbox_id`` takes what was just pushed to it now, not at its next check; whether it had
    to be woken. Call it right after the push. Never raises: the message is queued already, and a mailbox not woken
    takes it at its next check.

    Version 4 (a rest that any decide ends once it has rested a second, :mod:`.mailbox`): the server decided the
    mailbox after the push, which ended a rest older than a second, and the round's pull takes the message. So a look
    at the mailbox's tasks finds a forward in flight (its next pull follows, after the push: done), a pull whose
    evaluation has not begun (it reads the queue after the push: done), or a pull being evaluated, which may have taken
    nothing just before the push (its result not yet written): looked at again (:data:`_WAKE_PAUSES`, then every
    second) until a forward or a rest shows. A rest in progress began less than a second before the push,
    or after it: the server is asked to decide the mailbox once the rest has rested a second
    (``PUT /workflow/decide/{id}``; the caller waits up to a second for that: only when the mailbox's previous round
    was less than a second before).

    Version 3 (a ``WAIT`` of P seconds): the ``WAIT`` is completed (:meth:`ConductorApi.signal_wait`). Only decides
    and a ``WAIT``'s signal end a rest, never a task update of the SDK's, which could write over the server's own
    end of it (``docs/idle-listeners.md``, *The constraint*); two senders that wake one mailbox at once ask for two
    decides, which the server runs one after the other.

    The serving process's checks of an idle mailbox grow minutes apart (:mod:`.mailbox_checks`), so a wake does not
    give up early: a server too slow to answer, or one that answers 5xx or not at all for a moment, is asked again,
    for up to :data:`_WAKE_SECONDS`. Each ``pause`` returning True ends it (the process is closing).
    """
    deadline = clock.monotonic() + _WAKE_SECONDS
    looks = 0
    while True:
        try:
            woken = _look_and_wake(api, mailbox_id, pause=pause, clock=clock)
            if woken is not None:
                return woken
            why = "no forward or rest showed"
        except (ServerUnavailableError, HttpError) as err:
            if isinstance(err, HttpError) and err.status < 500 and err.status != 429:
                return _not_woken(mailbox_id, err)
            why = f"{type(err).__name__}: {err}"
        except ConductorAgentsError as err:  # not found, not running: nothing to wake
            return _not_woken(mailbox_id, err)
        delay = _WAKE_PAUSES[looks] if looks < len(_WAKE_PAUSES) else 1.0
        looks += 1
        if clock.monotonic() + delay > deadline:
            log.info("mailbox %s: not woken within %.0fs (%s); it takes the message at its next check", mailbox_id,
                     _WAKE_SECONDS, why)
            return False
        if pause(delay):
            return False


def _look_and_wake(api: ConductorApi, mailbox_id: str, *, pause: Callable[[float], Any], clock: Clock) -> bool | None:
    """One look at the mailbox: False when its round takes the message anyway (a forward in flight, or the process is
    closing), True when it was woken, None when it must be looked at again (a pull whose result is not yet written).
    Raises: as :meth:`ConductorApi.workflow_tasks`, :meth:`ConductorApi.decide_workflow`."""
    tasks = api.workflow_tasks(mailbox_id, statuses=("SCHEDULED", "IN_PROGRESS"), start=0, count=20).tasks
    if any(t.get("taskType") == FORWARD_TASK for t in tasks):
        return False  # a pull follows the forward, after the push
    if any(_not_begun(t) for t in tasks if t.get("taskType") == MESSAGE_WAIT_TASK_TYPE):
        return False  # its evaluation, which reads the queue, begins after this read, so after the push
    rest = next((t for t in tasks if t.get("taskType") == "HUMAN"  # version 3's WAIT has the same name
                 and t.get("taskDefName") == MAILBOX_REST_TASK), None)
    if rest is not None:
        return _end_rest(api, mailbox_id, rest, pause=pause, clock=clock)
    if any(t.get("taskType") == "WAIT" for t in tasks) and api.signal_wait(mailbox_id):  # version 3
        return True
    return None


def _not_begun(pull: Mapping[str, Any]) -> bool:
    """Whether the server has not begun to evaluate ``pull`` (an async system task): since 3.32.0 it writes the task's
    start time and poll count before it runs it (``AsyncSystemTaskExecutor.execute``), so a pull still ``SCHEDULED``
    without them reads the queue after this was read. (A loaded server's system-task queue can hold it for seconds.)
    """
    return pull.get("status") == "SCHEDULED" and not pull.get("startTime") and not pull.get("pollCount")


def _not_woken(mailbox_id: str, err: Exception) -> bool:
    log.info("mailbox %s: not woken (%s: %s); it takes the message at its next check", mailbox_id,
             type(err).__name__, err)
    return False


def _end_rest(api: ConductorApi, mailbox_id: str, rest: Mapping[str, Any], *, pause: Callable[[float], Any],
              clock: Clock) -> bool:
    """Have the server decide the mailbox once ``rest`` has rested a second (by its start on the server's clock,
    with a margin for a cluster's clocks), then look once more: a rest still there (the clocks further apart than the
    margin) gets one more decide. Raises: as :meth:`ConductorApi.decide_workflow`."""
    started = rest.get("startTime") or rest.get("scheduledTime")
    age = clock.time() - float(started) / 1000 if isinstance(started, (int, float)) and started > 0 else 0.0
    for attempt in range(2):
        if pause(min(max(0.0, _REST_ENDS_AFTER - age), _REST_ENDS_AFTER)):
            return False
        api.decide_workflow(mailbox_id)
        if attempt == 0:
            tasks = api.workflow_tasks(mailbox_id, statuses=("IN_PROGRESS",), start=0, count=20).tasks
            if not any(t.get("taskId") == rest.get("taskId") for t in tasks):
                return True
            age = 0.0  # its own second from here, at most
    return True


def push_to_mailbox(api: ConductorApi, mailbox_id: str, body: Mapping[str, Any], *,
                    pause: Callable[[float], Any]) -> str:
    """Push ``body`` into a listener's mailbox (the listener waits on a ``HUMAN`` task); its message id.

    Raises: as :meth:`ConductorApi.push_message`; ExecutionNotRunningError when the listener has ended.
    """
    try:
        message_id = api.push_message(mailbox_id, body)
    except ExecutionNotRunningError as err:
        raise ExecutionNotRunningError(f"listener {mailbox_id} has ended; it cannot receive messages",
                                       execution_id=mailbox_id) from err
    wake(api, mailbox_id, pause=pause)  # taken at once, not at the mailbox's next check
    return message_id


def _fate(api: ConductorApi, chain: Chain, link: Link, message_id: str, timeout: float, clock: Clock,
          pause: Callable[[float], Any]) -> bool | None:
    """Whether a message ``link`` accepted while its switch was under way reached the listener (True),
    was dropped with ``link``'s queue (False), or cannot be known yet (None: ``link`` is still running,
    so whoever completes the switch pulls it before ending ``link``).

    The switch's commit record says it; until it is written, ``link``'s own final state says it once
    ``link`` has been terminated for a moment (the record is built from that same state). While ``link`` runs, it
    pulls the message before it ends (None) once one of its waits was evaluated after the push (:func:`_pulled_since`):
    the switch's drain ends only after an evaluation of its wait, so a wait evaluated after the push took it. (Time
    alone proves nothing: on a loaded server, the switch's terminate can land many seconds after its drain's last
    look, with a message pushed meanwhile in the queue it drops.)
    """
    new = chain.link(link.number + 1)
    deadline = clock.monotonic() + timeout
    ended_seen: float | None = None  # when this process first saw ``link`` ended (its own clock)
    waits_at_first_look: dict[str, int] | None = None
    while True:
        record, open_ = read_commit(api, new)
        if record is not None:
            return message_id in record.pulled
        if not open_:
            return None  # the switch was abandoned: the listener ended with ``link``
        if RunStatus.parse(api.workflow_status(link.execution_id).get("status")).is_terminal:
            ended_seen = clock.monotonic() if ended_seen is None else ended_seen
            if clock.monotonic() - ended_seen >= _FINAL_AFTER_SECONDS:
                _, tail, variables = read_final_state(api, link.execution_id)
                return message_id in pulled_message_ids(variables, tail)
        else:
            waits = _waits(api, link.execution_id)
            if waits_at_first_look is None:
                waits_at_first_look = waits
            if _pulled_since(waits_at_first_look, waits):
                return None
        if clock.monotonic() >= deadline:
            return None
        pause(_COMMIT_POLL)


def _waits(api: ConductorApi, execution_id: str) -> dict[str, int]:
    """The pending wait-for-message tasks of run ``execution_id``: task id -> how often the server evaluated it."""
    page = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS", "SCHEDULED"), start=0, count=50)
    return {str(t.get("taskId")): int(t.get("pollCount") or 0) for t in page.tasks if is_message_wait(t)}


def _pulled_since(first: Mapping[str, int], now: Mapping[str, int]) -> bool:
    """Whether the run pulls a message pushed before ``first`` was read, given its pending waits then and now.

    No wait then: the run was busy, and its next wait, scheduled after the push, pops the message at its first
    evaluation (before any drain can call the run at rest). A wait then: once it has been evaluated
    :data:`~.switch.EVALUATIONS_SINCE` more times, or has ended (an evaluation found messages), one evaluation began
    after the push and took it.
    """
    return all(task_id not in now or now[task_id] >= count + EVALUATIONS_SINCE for task_id, count in first.items())
