"""Handing a mailbox's messages to a listener that waits on a ``HUMAN`` task (``listener_wait="human"``).

Such a listener's wait for messages is a ``HUMAN`` task (:func:`~.switch.as_human_wait`): the server never
evaluates it, and the run leaves the server's decider queue while it waits (``docs/idle-listeners.md``). The one
writer that completes it is the forward of the listener's mailbox (:mod:`.mailbox`), which runs in the process that
serves the listener: nothing else ever updates the wait, so no completion can be overwritten (a task update writes
the whole task back). The wait is completed with ``{messages, count}``, the output of the server's own wait for
messages, so the model and the SDK's delivery checks read it the same way. A batch that begins with the stop
message (nothing accepted before it is unread) sets the run's stop flag first: the loop ends after that wait,
and no model turn reads the stop (:mod:`.stopping`).

Only the newest link's wait is completed. A switch (:mod:`.switch`) ends the old link once it is at rest; it reads
"at rest" under :func:`delivery_lock`, which the forward holds from reading the newest link to completing its wait,
so a wait the forward completes is never one whose run the switch ends.

After it completed a wait, the forward nudges the wait's ``JOIN`` when the serving process parked it
(:mod:`.parking`): a parked join is not being evaluated, so the nudge races nothing.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from .._common.task_names import HUMAN_TASK_TYPE, is_message_wait
from .._wire.api import ConductorApi
from .stop_flag import post_stop_flag, stop_heads

__all__ = ["complete_wait", "delivery_lock", "waiting_wait"]

log = logging.getLogger("conductor_agents.continuation")

_locks: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_locks_guard = threading.Lock()


def delivery_lock(run_id: str) -> Any:
    """The lock of listener ``run_id`` in this process: held by a forward from reading the newest link to completing
    its wait, and by a switch while it reads whether the old link is at rest."""
    with _locks_guard:
        lock = _locks.get(run_id)
        if lock is None:
            lock = _locks[run_id] = threading.RLock()
        return lock


def waiting_wait(api: ConductorApi, execution_id: str) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """The run's wait for messages while it waits (a ``HUMAN`` wait in progress), and the ``JOIN`` in progress
    around it; ``(None, None)`` while the run is busy. One small request.

    Raises: as :meth:`ConductorApi.workflow_tasks`.
    """
    tasks = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS",), start=1, count=50).tasks  # 1: not the loop
    waits = [t for t in tasks if is_message_wait(t) and t.get("taskType") == HUMAN_TASK_TYPE]
    if not waits:
        return None, None
    joins = [t for t in tasks if t.get("taskType") == "JOIN"]
    return waits[0], (joins[-1] if joins else None)


def complete_wait(api: ConductorApi, execution_id: str, wait: Mapping[str, Any],
                  messages: Sequence[Mapping[str, Any]], *, worker_id: str) -> None:
    """Complete the waiting ``wait`` of run ``execution_id`` with ``messages`` (as the mailbox pulled them).

    Raises: as :meth:`ConductorApi.update_task`.
    """
    batch = [dict(m) for m in messages]
    if stop_heads(batch):  # nothing before the stop in this batch: the loop ends after this wait, no model turn
        post_stop_flag(api, execution_id)
    api.update_task({"workflowInstanceId": execution_id, "taskId": str(wait.get("taskId")), "status": "COMPLETED",
                     "workerId": worker_id, "outputData": {"messages": batch, "count": len(batch)}})
    log.debug("run %s: wait %s completed with %d message(s)", execution_id, wait.get("referenceTaskName"), len(batch))
