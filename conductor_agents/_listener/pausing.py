"""One run's status, and pausing and resuming it, each safe to repeat and to race: the moves ``pause()``/``unpause()``
and a switch share (a switch keeps a listener paused across it: ``Switch.keep_paused``)."""

from __future__ import annotations

from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ExecutionNotFoundError
from ..result import RunStatus

__all__ = ["is_paused", "pause_run", "resume_run", "run_status"]


def run_status(api: ConductorApi, execution_id: str) -> RunStatus:
    """The status of a run of any workflow (one small request); TERMINATED once it was removed (retired
    runs ended long ago)."""
    try:
        return RunStatus.parse(api.workflow_status(execution_id).get("status"))
    except ExecutionNotFoundError:
        return RunStatus.TERMINATED


def is_paused(api: ConductorApi, execution_id: str) -> bool:
    """Whether run ``execution_id`` is paused now (one small request; False once it ended or was removed)."""
    return run_status(api, execution_id) is RunStatus.PAUSED


def pause_run(api: ConductorApi, execution_id: str) -> bool:
    """Pause the run (a paused run is left as it is); whether it is paused now (False: it has ended)."""
    try:
        api.pause_workflow(execution_id)
    except HttpError as err:
        if err.status != 409:
            raise
        return False
    return True


def resume_run(api: ConductorApi, execution_id: str) -> None:
    """Resume the run if it is paused; a run not paused, or ended, is left as it is (also when another caller
    resumed it between the look and the resume: the server refuses a resume of a run that is not paused)."""
    if not is_paused(api, execution_id):
        return
    try:
        api.resume_workflow(execution_id)
    except (HttpError, ExecutionNotFoundError):
        if is_paused(api, execution_id):
            raise
