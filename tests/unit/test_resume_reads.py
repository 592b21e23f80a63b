"""``resume()`` of a continued listener whose switch a dead process left half done reads what it needs once:
the pending switch (a status and a task page of the newest run) is found once, for serving the chain and for
the tasks to reclaim."""

from __future__ import annotations

from typing import Any

import pytest

from conductor_agents import Agent, AgentSettings, WaitForMessageTool
from conductor_agents._common.clock import SYSTEM_CLOCK
from conductor_agents._common.task_names import CARRY_TASK
from conductor_agents._listener.directory import Chain, Link
from conductor_agents._runs import existing
from conductor_agents._wire.api import TaskPage
from conductor_agents.result import AgentStatus, RunStatus
from tests.unit.fakes import BASE_URL, count_compiles

CHAIN = Chain("run-0", "dom-1", "listener", 0)
NEWEST = CHAIN.link(1)


class RecordingApi:
    """The reads the resume makes, recorded: (method, execution id, statuses)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []

    def get_workflow(self, execution_id: str) -> dict[str, Any]:
        self.calls.append(("get_workflow", execution_id, ()))
        return {"workflowId": execution_id, "status": "RUNNING", "input": {"prompt": "p"}}

    def workflow_status(self, execution_id: str) -> dict[str, Any]:
        self.calls.append(("workflow_status", execution_id, ()))
        return {"status": "RUNNING"}

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 15,
                       statuses: tuple[str, ...] = ()) -> TaskPage:
        self.calls.append(("workflow_tasks", execution_id, statuses))
        return TaskPage(1, [{"taskType": CARRY_TASK, "status": "IN_PROGRESS", "referenceTaskName": "carry"}])


class Reservation:
    def commit(self, execution_id: str, *, domain: str | None) -> None:
        pass

    def cancel(self) -> None:
        pass


class Workers:
    def __init__(self) -> None:
        self.served: list[Link | None] = []

    def reserve(self, domain: str | None, agent: Agent, *, continued: bool = False) -> Reservation:
        return Reservation()

    def confirm_polling(self, reservation: Reservation) -> None:
        pass

    def serve_chain(self, reservation: Reservation, chain: Chain, spec: Any, newest: Link, *, turns_before: int,
                    pending_from: Link | None) -> str:
        self.served.append(pending_from)
        return "tracker"

    def reclaim_orphans(self, page: Any, domain: str | None) -> list[str]:
        return []


class Directory:
    def refresh(self, chain: Chain) -> Link:
        return NEWEST

    def anchor(self, chain: Chain, *, cached: bool = False) -> Chain:
        return chain  # no mailbox: its first run


def test_resuming_a_listener_mid_switch_finds_the_pending_switch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    api, workers = RecordingApi(), Workers()
    monkeypatch.setattr(existing, "current_status", lambda api, directory, chain: (
        NEWEST, AgentStatus(NEWEST.execution_id, RunStatus.RUNNING)))
    monkeypatch.setattr(existing, "running_sub_runs", lambda api, execution_id: ())
    taker = existing.RunTaker(api, Directory(), workers, AgentSettings(server_url=BASE_URL),  # type: ignore[arg-type]
                              clock=SYSTEM_CLOCK, worker_id="w", service=lambda: None,
                              handle=lambda *args, **kwargs: args)
    agent = Agent(name="listener", model="openai/gpt-4o-mini", stateful=True, tools=[WaitForMessageTool.create()])
    taker._resume_listener(CHAIN, agent, force=True, lease=False)
    assert [CHAIN.link(0)] == workers.served  # the switch is finished from the link it began at
    newest = NEWEST.execution_id
    assert 1 == api.calls.count(("workflow_status", newest, ()))
    assert 1 == api.calls.count(("workflow_tasks", newest, ()))
    reclaimed = {run for method, run, statuses in api.calls if statuses == ("IN_PROGRESS",)}
    assert {newest, CHAIN.link(0).execution_id} == reclaimed  # the half-done switch's old run too


def test_a_served_listener_takes_the_agent_key_its_start_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor_agents._listener.driver import _Served
    from conductor_agents._listener.switch import LinkSpec, agent_key
    from conductor_agents.continuation import Continuation

    agent = Agent(name="listener", model="openai/gpt-4o-mini", stateful=True, tools=[WaitForMessageTool.create()])
    key = agent_key(agent.name, agent.to_config())
    compiled = count_compiles(monkeypatch)
    spec = LinkSpec(agent, "p", Continuation(), agent_key=key)
    assert key == _Served(CHAIN, spec, NEWEST, 0, None, None).agent_key  # type: ignore[arg-type]
    assert [] == compiled
    unkeyed = LinkSpec(agent, "p", Continuation())  # a resume: compiled when served
    assert key == _Served(CHAIN, unkeyed, NEWEST, 0, None, None).agent_key  # type: ignore[arg-type]
    assert ["listener"] == compiled
