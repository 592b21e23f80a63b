"""Schedules (issue 33, point 6): an agent started on a cron expression by the server's own scheduler,
served by the process that serves the agent (it adopts the scheduled runs), listed, paused, unpaused and
deleted from the SDK."""

from __future__ import annotations

import logging
import threading

import attrs
import pytest

from conductor_agents import (Agent, AgentDefinitionError, AgentRuntime, ExecutionNotFoundError, ModelSettings,
                              RunStatus, ScheduleNotFoundError, ToolContext, tool)
from conductor_agents._serving.leases import lease_execution_id
from conductor_agents._scheduling.schedules import STARTED_BY, schedule_domain
from conductor_agents.testing import ToolCall

from ..helpers import eventually, listener
from .test_stateful_listener import ActionTools

pytestmark = pytest.mark.integration


class Reports:
    """A tool that records which run called it (its execution id) and what the scheduler put in its input."""

    def __init__(self) -> None:
        self.runs: "list[str]" = []
        self.lock = threading.Lock()

    @tool
    def report(self, ctx: ToolContext, topic: str) -> dict:
        """Write the report on a topic."""
        with self.lock:
            self.runs.append(ctx.execution_id)
        return {"written": topic}


@pytest.mark.both_topologies
def test_a_schedule_starts_runs_that_the_serving_process_adopts_and_can_be_paused_and_deleted(
        agent_settings, scripted_llm, unique_name, caplog):
    caplog.set_level(logging.DEBUG, logger="conductor_agents.serve")
    settings = attrs.evolve(agent_settings, liveness_stall_seconds=6.0, liveness_check_interval_seconds=1.0)
    model = scripted_llm.script([ToolCall("report", {"topic": "sales"}), "Report written."] * 50)
    reports = Reports()
    agent = Agent(name=unique_name("daily"), model=model, tools=[reports.report], stateful=True,
                  instructions="Write the report.")
    name = unique_name("every_two_seconds")
    with AgentRuntime(settings) as runtime:
        assert runtime.schedules.next_runs("*/2 * * * * *", 3)[1].second % 2 == 0
        with pytest.raises(ValueError, match="six fields"):
            runtime.schedules.create(agent, "Go.", name=name, cron="* * * * *")
        with pytest.raises(ValueError, match="time zone"):
            runtime.schedules.create(agent, "Go.", name=name, cron="* * * * * *", zone="Mars/Olympus_Mons")
        with pytest.raises(AgentDefinitionError, match="stateful"):
            runtime.schedules.create(attrs.evolve(agent, stateful=False), "Go.", name=name, cron="* * * * * *")
        with pytest.raises(AgentDefinitionError, match="listener"):
            runtime.schedules.create(listener(agent.name, model, ActionTools()), "Go.", name=name,
                                     cron="* * * * * *")

        runtime.serve(agent)
        made = runtime.schedules.create(agent, "Write today's report.", name=name, cron="*/2 * * * * *",
                                        context={"team": "sales"}, description="the daily report")
        assert (made.name, made.agent_name, made.paused, made.domain, dict(made.context)) == \
            (name, agent.name, False, schedule_domain(name), {"team": "sales"})
        assert [s.name for s in runtime.schedules.list(agent)] == [name]
        # A start with other model settings replaces the definition the server keeps under the agent's name;
        # the schedule carries its own, so its runs keep the model it was made with.
        other = scripted_llm.script(["Nothing to do."])
        runtime.start(agent, "One-off.", model_settings=ModelSettings(model=other)).cancel("not needed")

        def state() -> str:
            runs = runtime._api.running_workflow_ids(agent.name)
            tasks = [(t.get("taskType"), t.get("status"), t.get("domain"))
                     for r in runs[:2] for t in runtime._api.get_workflow(r, include_tasks=True).get("tasks") or []
                     if t.get("taskType") in ("report",)]
            said = [r.getMessage() for r in caplog.records if r.name == "conductor_agents.serve"][-15:]
            return (f"running runs {runs[:3]} ({len(runs)}), their tasks {tasks[:8]}, schedule "
                    f"{runtime.schedules.get(name)}, serve log {said}")

        eventually(lambda: reports.runs, timeout=90, message="a scheduled run's tool ran in the serving process",
                   explain=state)
        run = runtime._api.get_workflow(reports.runs[0])
        assert run["input"][STARTED_BY] == name and run["input"]["prompt"] == "Write today's report."
        assert set(run["taskToDomain"].values()) == {schedule_domain(name)}
        models = {t["inputParameters"].get("model") for t in _tasks(run["workflowDefinition"])
                  if t.get("type") == "LLM_CHAT_COMPLETE"}
        assert models == {model.split("/", 1)[1]}, models
        eventually(lambda: runtime.attach(reports.runs[0]).status().status is RunStatus.COMPLETED, timeout=60,
                   message="the scheduled run completed")
        # The later runs share the domain: the process that adopted the first takes them up as they come, with
        # no new lease (one lease run per change of owner, not per scheduled run).
        eventually(lambda: len(set(reports.runs)) >= 3, timeout=60, explain=state,
                   message="three scheduled runs served here, the later ones after the first had ended")
        with pytest.raises(ExecutionNotFoundError):
            runtime._api.get_workflow(lease_execution_id(schedule_domain(name), 1))

        paused = runtime.schedules.pause(name)
        assert (paused.paused, paused.next_run) == (True, None)
        assert runtime.schedules.unpause(name).paused is False
        assert runtime.schedules.delete(name) is True
        assert runtime.schedules.delete(name) is False
        with pytest.raises(ScheduleNotFoundError):
            runtime.schedules.get(name)
        assert runtime.schedules.list(agent) == ()
        for execution_id in runtime._api.running_workflow_ids(agent.name):  # a run started as it was deleted
            runtime.attach(execution_id).cancel("test over")


def _tasks(definition: dict) -> "list[dict]":
    """Every task of a workflow definition, nested ones (loops, forks, switches) included."""
    found: "list[dict]" = []
    stack = list(definition.get("tasks") or [])
    while stack:
        task = stack.pop()
        found.append(task)
        stack += task.get("loopOver") or []
        for branch in task.get("forkTasks") or []:
            stack += branch
        for branch in (task.get("decisionCases") or {}).values():
            stack += branch
        stack += task.get("defaultCase") or []
    return found
