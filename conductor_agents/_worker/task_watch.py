"""While a tool runs: is its call still wanted? And how a task is handed back for another delivery.

:class:`CancellationWatch` is driven by the executor's lease thread. It looks only at tools that
have run for a while (``interval``, 2 s), so an idle run, or one whose tools are quick, costs
nothing. For each run with such a tool it reads the run once (``GET /workflow/{id}``: has it
ended? was a graceful stop asked, ``_stop_requested``?) and each such task once
(``GET /tasks/{id}``: does the server still hold it for this worker?), then sets the contexts'
events. Stateless between sweeps apart from when each task was last looked at.

:func:`hand_back` is how a task goes back to the server for another delivery without the model
seeing a failure: ``IN_PROGRESS`` with ``callbackAfterSeconds``, so the server requeues the same
task (``pollCount`` goes up) and the agent loop keeps waiting for it. A ``FAILED`` status would
also be retried, but the agent's join treats a failed (optional) tool as done at once and shows
the failure to the model, and the retry's result is then lost (measured on Conductor 3.32.3).
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from .._tooldefs.context import CancelReason, ToolContext, cancel
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from ..result import RunStatus, stop_requested

__all__ = ["CancellationWatch", "WatchedCall", "hand_back"]

log = logging.getLogger("conductor_agents.worker")


class WatchedCall(Protocol):
    """What the watch needs of an in-flight call (the executor's bookkeeping object)."""

    context: ToolContext
    started: float
    poll_count: int
    last_checked: float
    body_done: bool


#: The shortest hand-back delay. With 0 the task is visible again before the server has stored the
#: hand-back, and a quick poll's ``pollCount``/``workerId`` can be overwritten by that older copy.
MIN_CALLBACK_SECONDS = 1


def callback_seconds(after_seconds: float) -> int:
    """``callbackAfterSeconds`` for a hand-back: whole seconds, rounded up, at least one."""
    return max(MIN_CALLBACK_SECONDS, math.ceil(after_seconds))


def hand_back(api: ConductorApi, *, workflow_id: str, task_id: str, worker_id: str, after_seconds: float = 0.0,
              note: str | None = None) -> None:
    """Requeue a task for another delivery in ``after_seconds`` (at least 1 s; the same task id; the run waits).

    Raises:
        ServerUnavailableError, ServerError: the update did not go through.
    """
    body: dict[str, Any] = {
        "workflowInstanceId": workflow_id, "taskId": task_id, "workerId": worker_id, "status": "IN_PROGRESS",
        "callbackAfterSeconds": callback_seconds(after_seconds), "outputData": {},
    }
    if note:
        body["logs"] = [{"log": note[:4000]}]
    api.update_task(body)


class CancellationWatch:
    """Sets ``cancelled`` / ``stop_requested`` on the contexts of long-running tools. Used by one thread."""

    def __init__(self, api: ConductorApi, *, worker_id: str, interval: float = 2.0,
                 on_cancel: Callable[[ToolContext, str], None] | None = None) -> None:
        self._api = api
        self._worker_id = worker_id
        self.interval = interval
        self._on_cancel = on_cancel

    def due(self, calls: Iterable[WatchedCall], now: float) -> list[WatchedCall]:
        """The calls whose body has run for at least ``interval`` and was not looked at for as long,
        not yet cancelled (a body that returned, its result being posted, is not looked at)."""
        return [c for c in calls if not c.context.cancelled.is_set() and not c.body_done
                and now - max(c.started, c.last_checked) >= self.interval]

    def sweep(self, calls: Iterable[WatchedCall], now: float) -> None:
        """Look at each due call's run and task once; set the events the server's answers call for."""
        by_run: dict[str, list[WatchedCall]] = collections.defaultdict(list)
        for call in self.due(calls, now):
            call.last_checked = now
            by_run[call.context.execution_id].append(call)
        for execution_id, run_calls in by_run.items():
            if self._check_run(execution_id, run_calls):
                for call in run_calls:
                    self._check_task(call)

    def _check_run(self, execution_id: str, calls: list[WatchedCall]) -> bool:
        """Read the run; cancel its calls if it ended. True when its tasks should be looked at."""
        try:
            workflow = self._api.get_workflow(execution_id)
        except ExecutionNotFoundError:
            self._cancel(calls, CancelReason.RUN_ENDED)
            return False
        except ConductorAgentsError as err:
            log.debug("cancellation check of run %s failed: %s", execution_id, err)
            return False
        if RunStatus.parse(workflow.get("status")).is_terminal:
            self._cancel(calls, CancelReason.RUN_ENDED)
            return False
        if stop_requested(workflow):
            for call in calls:
                call.context.stop_requested.set()
        return True

    def _check_task(self, call: WatchedCall) -> None:
        context = call.context
        try:
            task = self._api.get_task(context.task_id)
        except HttpError as err:
            if err.status == 404:
                self._cancel([call], CancelReason.TASK_LOST)
            return
        except ConductorAgentsError as err:
            log.debug("cancellation check of task %s failed: %s", context.task_id, err)
            return
        if not held_by(task, call.poll_count):
            self._cancel([call], CancelReason.TASK_LOST)

    def _cancel(self, calls: list[WatchedCall], reason: str) -> None:
        for call in calls:
            if cancel(call.context, reason) and self._on_cancel is not None:
                self._on_cancel(call.context, reason)


def held_by(task: Mapping[str, Any], poll_count: int) -> bool:
    """Whether the server still holds ``task`` for the delivery that was poll number ``poll_count``.

    Another delivery (a retry, or a worker that took the task over after a hand-back) shows as
    a higher ``pollCount``. ``workerId`` is not compared: the server may briefly write back a
    hand-back's worker id after the next poll took the task.
    """
    if task.get("status") != "IN_PROGRESS":
        return False
    polls = task.get("pollCount")
    return not (isinstance(polls, int) and polls > poll_count)
