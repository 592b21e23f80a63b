"""A run's tree: the sub-runs its sub-agents and agent tools are running right now.

The server (3.32.3) runs every sub-agent and agent tool as a ``SUB_WORKFLOW`` task; the sub-run
inherits the parent run's task domain, so its worker tasks are the parent's to serve (and, after
a crash, to reclaim). Only running sub-runs matter here: an ended one has no task left to serve.

Pure functions over :class:`ConductorApi` reads; thread-safe.
"""

from __future__ import annotations

from typing import Iterator

from ._api import ConductorApi

__all__ = ["SUB_RUN_TASK", "running_sub_runs"]

SUB_RUN_TASK = "SUB_WORKFLOW"
#: How deep a tree is followed (agents of agents of agents...); deeper sub-runs are not reclaimed.
_MAX_DEPTH = 8
#: IN_PROGRESS tasks read per run: a run has at most a few sub-runs running at once.
_PAGE = 200


def running_sub_runs(api: ConductorApi, execution_id: str, *, depth: int = _MAX_DEPTH) -> Iterator[str]:
    """The execution ids of the sub-runs of ``execution_id`` still running, depth first (one read per run).

    Raises:
        ServerError: a read failed.
    """
    if depth <= 0:
        return
    page = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS",), start=0, count=_PAGE)
    for task in page.tasks:
        child = task.get("subWorkflowId")
        if task.get("taskType") == SUB_RUN_TASK and child:
            yield str(child)
            yield from running_sub_runs(api, str(child), depth=depth - 1)
