"""Standing signals: text the server puts before every later model turn of a run (``signal()``).

The server (3.32.3) keeps one signal per run, the workflow variable ``_signal_injection``, set by
``POST /agent/{id}/signal`` (a second signal replaces the first; an empty one clears it); each model turn
of the agent's loop then begins its user message with ``[SIGNALS]\\n<text>\\n[/SIGNALS]``. Two things
the server does not do, done here:

- It writes the variable with a plain read-modify-write of the run, outside the lock its decider holds:
  a signal that arrives before the run's first state task ran is reset to ``""`` by that task, and one
  that lands while the decider updates the run can be overwritten. So the signal is posted once that
  task has run, read back, and posted again when it did not stick.
- It answers 200 for a run that has ended; :func:`post_signal` says so instead.

A continued listener's new run starts with no signal: the switch copies the old run's into it as soon as
the new run exists (:func:`carry_signal`), before its first model turn; from then on a ``signal()``
reaches both runs until the old one ends. Pure functions over the API; thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import MODEL_TASK_TYPE
from .._wire.api import ConductorApi
from ..errors import ServerError
from ..result import RunStatus

__all__ = ["SIGNAL_VARIABLE", "carry_signal", "post_signal", "read_signal"]

log = logging.getLogger("conductor_agents.signals")

#: The run's variable the server keeps the signal in.
SIGNAL_VARIABLE = "_signal_injection"
#: How long a run's first state task (which creates the variable) is waited for before posting anyway.
_INIT_WAIT_SECONDS = 10.0
#: Pause between reads while waiting for it, and before reading a posted signal back.
_PAUSE = 0.2
#: The longest a post waits for a model turn in flight to end before reading the signal back.
_TURN_WAIT_SECONDS = 60.0
#: When a posted signal is read back (seconds after the post, then after the first check).
_CHECKS = (0.2, 1.0)
#: Posts of one signal before giving up on it sticking.
_ATTEMPTS = 5


def read_signal(api: ConductorApi, execution_id: str) -> tuple[bool, str | None]:
    """Whether run ``execution_id`` is still running, and its signal (None before its first state task)."""
    status = api.workflow_status(execution_id, include_variables=True)
    variables = status.get("variables") or {}
    value = variables.get(SIGNAL_VARIABLE) if SIGNAL_VARIABLE in variables else None
    return not RunStatus.parse(status.get("status")).is_terminal, None if value is None else str(value)


def _initialised(api: ConductorApi, execution_id: str) -> bool | None:
    """Whether the run's task that starts its signal empty (a SET_VARIABLE near its start) has run; None when
    the run has none (a run without a loop, already at its model turn)."""
    page = api.workflow_tasks(execution_id, start=0, count=20)
    for task in page.tasks:
        if task.get("taskType") == "SET_VARIABLE" and SIGNAL_VARIABLE in (task.get("inputData") or {}):
            return task.get("status") == "COMPLETED"
    return None if any(t.get("taskType") == MODEL_TASK_TYPE for t in page.tasks) else False


def _settle(api: ConductorApi, execution_id: str, *, pause: Callable[[float], object], clock: Clock) -> None:
    """Wait (bounded) until no model turn of the run is in flight: the server writes the run it read when
    the turn began once the model answers, which undoes a signal posted meanwhile."""
    deadline = clock.monotonic() + _TURN_WAIT_SECONDS
    while clock.monotonic() < deadline:
        page = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS", "SCHEDULED"), start=0, count=50)
        if not any(t.get("taskType") == MODEL_TASK_TYPE for t in page.tasks):
            return
        pause(_PAUSE)


def _wait_initialised(api: ConductorApi, execution_id: str, *, pause: Callable[[float], object],
                      clock: Clock) -> bool | None:
    """Wait (bounded) until the run's first state task, which would reset a signal, has run: True then (or
    at the bound), None when the run has no such task (no loop), False when the run has ended."""
    deadline = clock.monotonic() + _INIT_WAIT_SECONDS
    while True:
        running, _ = read_signal(api, execution_id)
        if not running:
            return False
        initialised = _initialised(api, execution_id)
        if initialised is None or initialised or clock.monotonic() >= deadline:
            return None if initialised is None else True
        pause(_PAUSE)


def post_signal(api: ConductorApi, execution_id: str, text: str, *, pause: Callable[[float], object],
                clock: Clock = SYSTEM_CLOCK) -> bool:
    """Set the signal of one run to ``text`` and see that it stuck; False when the run has ended.

    Raises:
        ExecutionNotFoundError: the server does not know the run.
        ServerError: the signal did not stick after several posts (the run's state keeps changing under it).
    """
    ready = _wait_initialised(api, execution_id, pause=pause, clock=clock)
    if ready is False:
        return False
    if ready is None:  # no loop: nothing resets it, nothing reads it back
        api.signal_agent(execution_id, text)
        return True
    for _ in range(_ATTEMPTS):
        api.signal_agent(execution_id, text)
        stuck = True
        for wait in _CHECKS:  # a decision under way when it was posted writes the run it read before: look again
            pause(wait)
            _settle(api, execution_id, pause=pause, clock=clock)
            running, current = read_signal(api, execution_id)
            if not running:
                return False
            if current != text:
                stuck = False
                log.info("run %s: its signal was overwritten by the server; posting it again", execution_id)
                break
        if stuck:
            return True
    raise ServerError(f"the signal of run {execution_id} did not stick after {_ATTEMPTS} posts (the run's "
                      "state kept changing under it); send it again")


def carry_signal(api: ConductorApi, old_id: str, new_id: str, *, pause: Callable[[float], object],
                 clock: Clock = SYSTEM_CLOCK) -> None:
    """Give a continued listener's new run (just started) the signal its old run has, unless it has one of
    its own already (a ``signal()`` after the new run began reaches both runs). Posted once, never fought
    over: the old run's signal is read only once the new run can take it, and a ``signal()`` that lands
    between that read and the post is the one thing it can undo (a window of one request)."""
    try:
        if not read_signal(api, old_id)[1]:
            return  # the common case, one request: a signal() from now on reaches the new run itself
        if not _wait_initialised(api, new_id, pause=pause, clock=clock):
            return
        _, text = read_signal(api, old_id)
        if text and not read_signal(api, new_id)[1]:
            api.signal_agent(new_id, text)
            log.info("run %s: the standing signal of %s carried over", new_id, old_id)
    except ServerError as err:  # never stops a switch: its model runs without the signal
        log.warning("run %s: the standing signal of %s could not be carried over (%s)", new_id, old_id, err)
