"""Runs the server failed by its own fault, retried: a decision whose tasks the server could not write.

When the server decides a run and cannot write the tasks it decided (its store restarting: Redis answering
``LOADING Redis is loading the dataset in memory`` or dropping the connection), ``WorkflowExecutor`` turns the error
into a ``TerminateWorkflowException`` and ends the run **FAILED** with the reason ``Error scheduling tasks: [ids], for
workflow: <id>`` (3.32.3, ``WorkflowExecutorOps.scheduleTask``), its unwritten tasks ``CANCELED``. Nothing about the
run failed: no task ran and failed, the model and the tools were not at fault. Seen in the hour-long soak on the
Redis cluster: four listeners (meant to live for months) ended FAILED at Redis restarts, and the messages accepted
for them were never acted on.

The cure is the server's own retry (``POST /workflow/{id}/retry``): the ``CANCELED`` tasks are scheduled again (a
``JOIN`` or ``DO_WHILE`` goes back in progress) and the run goes on where it stopped. Whoever of the SDK first sees
such a run ended retries it: a handle's status or wait, the watchdog of the process that serves it, a listener's
switch. A retry that finds the run running again (another process retried it first) is fine. Bounded: a run that
failed this way again within :data:`RETRY_SPACING_SECONDS` of its last retry (by the server's clock) is left FAILED,
with a warning: the fault is not passing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError
from ..result import RunStatus

__all__ = ["RETRY_SPACING_SECONDS", "SCHEDULING_FAILURE", "is_scheduling_failure", "retry_if_server_fault"]

log = logging.getLogger("conductor_agents.liveness")

#: How the server's reason begins when it could not write the tasks it decided.
SCHEDULING_FAILURE = "Error scheduling tasks"
#: A run that failed this way again within this long of its last retry is left FAILED.
RETRY_SPACING_SECONDS = 60.0


def is_scheduling_failure(status: Any, reason: Any) -> bool:
    """Whether a run's status and reason say the server failed it because it could not write the tasks it decided."""
    return RunStatus.parse(status) is RunStatus.FAILED and str(reason or "").startswith(SCHEDULING_FAILURE)


def retry_if_server_fault(api: ConductorApi, execution_id: str, *, seen: Mapping[str, Any] | None = None) -> bool:
    """Retry ``execution_id`` if the server failed it for want of writing its tasks (see the module); whether it
    runs again (retried here or by another process). ``seen``: a read of the run its caller made (any of the
    server's status shapes); when it shows another end, nothing more is read.

    Raises: as :meth:`ConductorApi.get_workflow` and :meth:`ConductorApi.retry_workflow`."""
    if seen is not None and not is_scheduling_failure(seen.get("status"), seen.get("reasonForIncompletion",
                                                                                    seen.get("reason"))):
        return False
    run = api.get_workflow(execution_id, include_tasks=False)
    status = RunStatus.parse(run.get("status"))
    if status is RunStatus.RUNNING:
        return True  # retried already (by another process)
    if not is_scheduling_failure(run.get("status"), run.get("reasonForIncompletion")):
        return False
    last_retry, ended = _millis(run.get("lastRetriedTime")), _millis(run.get("endTime") or run.get("updateTime"))
    if last_retry and ended and ended - last_retry < RETRY_SPACING_SECONDS * 1000:
        log.warning("run %s failed again %.0fs after it was retried (%s): left FAILED, the server's fault is not "
                    "passing", execution_id, (ended - last_retry) / 1000, run.get("reasonForIncompletion"))
        return False
    try:
        api.retry_workflow(execution_id)
    except ConductorAgentsError:  # another process's retry came first ("still running"), or the retry failed
        if RunStatus.parse(api.workflow_status(execution_id).get("status")) is RunStatus.RUNNING:
            return True
        raise
    log.warning("run %s was failed by the server, which could not write the tasks it decided (%s); retried: it goes "
                "on where it stopped", execution_id, run.get("reasonForIncompletion"))
    return True


def _millis(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
