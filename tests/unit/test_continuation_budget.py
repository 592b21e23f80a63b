"""How many turns a link had when its switch begins: the next link's budget is what is left."""

from __future__ import annotations

import types
from typing import Any, List

from conductor_agents._wire.api import TaskPage
from conductor_agents._listener.directory import Chain
from conductor_agents._listener.driver import ContinuationDriver

OLD = Chain("first-run", "0" * 32, "listener", 0).link(0)


class InProgressApi:
    """``GET /workflow/{id}/tasks?status=IN_PROGRESS`` over ``tasks``, paged from offset 0 as the server does."""

    def __init__(self, tasks: List[dict]) -> None:
        self.tasks = tasks

    def workflow_tasks(self, execution_id: str, *, statuses: Any = (), start: int = 0, count: int = 15) -> TaskPage:
        assert execution_id == OLD.execution_id and statuses == ("IN_PROGRESS",)
        return TaskPage(total=len(self.tasks), tasks=self.tasks[start:start + count], date=None)


def turns_of(tasks: List[dict]) -> int:
    return ContinuationDriver._turns_of(types.SimpleNamespace(_api=InProgressApi(tasks)), OLD)  # type: ignore[arg-type]


def test_the_turns_are_the_loop_iteration_of_the_tasks_in_progress():
    assert turns_of([{"taskType": "DO_WHILE", "iteration": 7}, {"taskType": "PULL_WORKFLOW_MESSAGES",
                                                                "iteration": 7}]) == 7


def test_between_two_tasks_the_loop_task_alone_still_tells_the_turns():
    """The loop task is the first in progress; when it is the only one, its iteration is the answer
    (read from offset 1 it was missed, and the next link was given the whole budget again)."""
    assert turns_of([{"taskType": "DO_WHILE", "iteration": 12}]) == 12


def test_a_run_with_nothing_in_progress_has_no_turns_to_count():
    assert turns_of([]) == 0
