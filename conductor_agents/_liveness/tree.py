"""A run's tree: the sub-runs its sub-agents and agent tools are running right now.

The server (3.32.3) runs every sub-agent and agent tool as a ``SUB_WORKFLOW`` task; the sub-run
inherits the parent run's task domain, so its worker tasks are the parent's to serve (and, after
a crash, to reclaim). Only running sub-runs matter here: an ended one has no task left to serve.

Pure functions over :class:`ConductorApi` reads; thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ExecutionNotFoundError

log = logging.getLogger("conductor_agents.worker")

__all__ = ["SUB_RUN_TASK", "RootFinder", "all_sub_runs", "running_sub_runs"]

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


def all_sub_runs(api: ConductorApi, execution_id: str, *, depth: int = _MAX_DEPTH) -> list[str]:
    """Every sub-run of ``execution_id`` (sub-agents, agent tools, and theirs), deepest first; a run
    already gone has none (one full read per run: the runs of an ended tree, to remove them).

    Raises:
        ServerError: a read failed.
    """
    if depth <= 0:
        return []
    try:
        tasks = api.get_workflow(execution_id, include_tasks=True).get("tasks") or ()
    except ExecutionNotFoundError:
        return []
    found: list[str] = []
    for task in tasks:
        child = task.get("subWorkflowId") if isinstance(task, dict) else None
        if task.get("taskType") == SUB_RUN_TASK and child:
            found.extend(all_sub_runs(api, str(child), depth=depth - 1))
            found.append(str(child))
    return found


class RootFinder:
    """Which top-level run a sub-run belongs to, by its ``parentWorkflowId`` chain (cached). Thread-safe.

    Used when a run ends or is asked to stop here, for the tools this process runs in other runs: a
    sub-run's tool learns it too (``ctx.cancelled``, ``ctx.stop_requested``). One read per sub-run.
    """

    #: Past this many cached answers the cache starts over (a long-lived runtime sees many sub-runs).
    _MAX_CACHED = 4096

    def __init__(self, api: ConductorApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._parents: dict[str, str | None] = {}

    def root_of(self, workflow_id: str, depth: int = _MAX_DEPTH) -> str | None:
        """The top-level run of ``workflow_id`` (itself when it has no parent); None when it cannot be read."""
        current = workflow_id
        for _ in range(depth):
            parent = self._parent(current)
            if parent is None:
                return current
            if parent == "":
                return None
            current = parent
        return current

    def _parent(self, workflow_id: str) -> str | None:
        """The run's parent id, None for a top-level run, "" when it could not be read."""
        with self._lock:
            if workflow_id in self._parents:
                return self._parents[workflow_id]
        try:
            parent = self._api.get_workflow(workflow_id).get("parentWorkflowId") or None
        except ConductorAgentsError as err:
            log.debug("could not read run %s to find its parent: %s", workflow_id, err)
            return ""
        with self._lock:
            if len(self._parents) >= self._MAX_CACHED:
                self._parents.clear()
            self._parents[workflow_id] = parent
        return parent
