"""A model call no node ever started (its queue message leased and dropped at a Redis restart) is made due again
(the real server's case: ``tests/reliability/test_server_fault.py``)."""

from __future__ import annotations

from email.utils import formatdate
from typing import Any

from conductor_agents._liveness.nudges import nudge_unstarted_model_calls, unstarted_model_calls
from conductor_agents._wire.api import TaskPage

NOW = 1_796_682_000.0
RUN = "0b7a5c1e-2f3d-4e5a-8b6c-7d8e9f0a1b2d"


def _call(task_id: str = "t1", *, age: float = 120.0, polls: int = 0, started: int = 0, status: str = "SCHEDULED",
          task_type: str = "LLM_CHAT_COMPLETE") -> dict[str, Any]:
    return {"taskId": task_id, "taskType": task_type, "status": status, "pollCount": polls, "startTime": started,
            "scheduledTime": int((NOW - age) * 1000), "workflowInstanceId": RUN, "referenceTaskName": "llm__2"}


def test_only_a_model_call_due_long_and_never_started_counts():
    tasks = [_call("old"), _call("young", age=10), _call("polled", polls=1), _call("started", started=1),
             _call("running", status="IN_PROGRESS"), _call("tool", task_type="act")]
    assert [t["taskId"] for t in unstarted_model_calls(tasks, server_now=NOW)] == ["old"]


class _Api:
    def __init__(self, scheduled: list[dict[str, Any]], fresh: dict[str, dict[str, Any]]) -> None:
        self.scheduled, self.fresh, self.updates = scheduled, fresh, []

    def workflow_tasks(self, execution_id: str, **kwargs: Any) -> TaskPage:
        assert kwargs.get("statuses") == ("SCHEDULED",)
        return TaskPage(total=len(self.scheduled), tasks=self.scheduled, date=formatdate(NOW, usegmt=True))

    def get_task(self, task_id: str) -> dict[str, Any]:
        return self.fresh[task_id]

    def update_task(self, result: dict[str, Any]) -> None:
        self.updates.append(result)


def test_a_call_still_unstarted_when_read_again_is_made_due_and_one_a_node_took_meanwhile_is_not():
    api = _Api([_call("dropped"), _call("taken")], {"dropped": _call("dropped"), "taken": _call("taken", polls=1)})
    assert nudge_unstarted_model_calls(api, RUN) == 1  # type: ignore[arg-type]
    [update] = api.updates
    assert (update["taskId"], update["status"], update["callbackAfterSeconds"]) == ("dropped", "IN_PROGRESS", 0)
