"""Steering a running agent (``signal()``) and per-run model settings (``ModelSettings``), on the real server."""

from __future__ import annotations

import pytest
import requests

from conductor_agents import Agent, AgentRuntime, Continuation, ExecutionNotRunningError, ModelSettings, RunStatus
from conductor_agents._common.task_names import MODEL_TASK_TYPE, is_message_wait
from conductor_agents._teams.model_settings import recorded_model_settings
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, listener_runs
from .test_long_listeners import ActionTools, act_on

pytestmark = pytest.mark.integration


def turn_after(scripted_llm, model: str, action: str):
    """The model request that was handed the message ``{"action": action}``."""
    found = [r for r in scripted_llm.requests_for(model) if {"action": action} in r.messages]
    assert found, f"no request was handed {action!r}"
    return found[-1]


def waiting(url: str, handle) -> bool:
    """Whether the listener's current run waits for a message (its wait task, of either kind, is in progress)."""
    page = requests.get(f"{url}/workflow/{handle.current_execution_id}/tasks",
                        params={"status": "IN_PROGRESS", "count": 20}, timeout=10).json()
    return any(is_message_wait(t) for t in page.get("results") or ())


def act_and_check(handle, tools, action: str) -> None:
    handle.send_message({"action": action})
    eventually(lambda: action in tools.snapshot(), timeout=60, interval=0.1, message=f"{action} acted on")


@pytest.mark.both_topologies
def test_a_listener_keeps_its_signal_and_model_settings_across_continued_runs(agent_runtime, scripted_llm,
                                                                              unique_name, topology_server):
    """A signal is shown to every later model turn, in the listener's next run too, until replaced or cleared;
    the run's model settings reach the model in every run of the listener; the agent is unchanged; a signal
    to the ended listener is refused."""
    tools = ActionTools()
    defined = scripted_llm.script(policy=listener_policy(act_on))  # the agent's own model: never called
    chosen = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("steer"), defined, tools, continuation=Continuation(max_turns=2))
    settings = ModelSettings(model=chosen, temperature=0.3, max_tokens=77, reasoning_effort="low")
    handle = agent_runtime.start(agent, "Start listening.", model_settings=settings)
    # Signalled once it waits: the server (3.32.3) can lose a signal posted during its own update of the run.
    scripted_llm.wait_for_requests(chosen, 1, timeout=60)
    eventually(lambda: handle.pending() == () and waiting(getattr(topology_server, "url"), handle), timeout=60, interval=0.2,
               message="the listener waits for a message")
    handle.signal("Answer in French.")
    act_and_check(handle, tools, "a")
    assert turn_after(scripted_llm, chosen, "a").signal == "Answer in French."
    eventually(lambda: handle.runs >= 2, timeout=60, interval=0.2, message="a continued run")
    act_and_check(handle, tools, "b")
    later = turn_after(scripted_llm, chosen, "b")
    assert later.is_continuation and later.signal == "Answer in French."
    assert later.body["max_output_tokens"] == 77 and later.body["reasoning"]["effort"] == "low"
    # The server's OpenAI provider (3.32.3) does not forward temperature: its model task has it.
    url = getattr(topology_server, "url")
    runs = [requests.get(f"{url}/workflow/{run_id}", params={"includeTasks": "true"}, timeout=30).json()
            for run_id in listener_runs(url, handle.execution_id)]
    model_tasks = [t for run in runs for t in run["tasks"] if t["taskType"] == MODEL_TASK_TYPE]
    assert len(runs) >= 2 and {t["inputData"].get("temperature") for t in model_tasks} == {0.3}
    # What a process that adopts or resumes the listener reads back, from whichever run it finds.
    assert {recorded_model_settings(run) for run in runs} == {settings}

    agent_runtime.signal(handle.execution_id, "Answer in German.")  # by id: a second signal replaces the first
    act_and_check(handle, tools, "c")
    assert turn_after(scripted_llm, chosen, "c").signal == "Answer in German."
    handle.signal("")
    act_and_check(handle, tools, "d")
    assert turn_after(scripted_llm, chosen, "d").signal is None

    handle.stop()
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    with pytest.raises(ExecutionNotRunningError):
        handle.signal("too late")
    assert agent.model == defined and scripted_llm.requests_for(defined) == ()
    scripted_llm.assert_no_anomalies(chosen)


def test_model_settings_reach_a_teams_sub_agents_for_that_run_only(agent_runtime, scripted_llm, unique_name):
    """A sequential team started with a model answers from it in both stages; the next run without settings
    uses the agents' own models."""
    first = Agent(name=unique_name("first"), model=scripted_llm.script(policy=lambda r: "first says hi"))
    second = Agent(name=unique_name("second"), model=scripted_llm.script(policy=lambda r: "second says hi"))
    team = Agent(name=unique_name("team"), model=scripted_llm.script(["unused"]), agents=[first, second],
                 strategy="sequential", max_turns=2)
    chosen = scripted_llm.script(policy=lambda r: "chosen says hi")
    result = agent_runtime.run(team, "Say hi.", timeout=120, model_settings=ModelSettings(model=chosen, max_tokens=50))
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "chosen says hi"
    asked = scripted_llm.requests_for(chosen)
    assert len(asked) == 2 and {r.body["max_output_tokens"] for r in asked} == {50}
    assert scripted_llm.requests_for(first.model) == () and scripted_llm.requests_for(second.model) == ()

    again = agent_runtime.run(team, "Say hi.", timeout=120)
    assert again.output == "second says hi" and len(scripted_llm.requests_for(chosen)) == 2


def test_a_resumed_listener_keeps_its_model_settings_and_signal_in_its_next_runs(agent_settings, scripted_llm,
                                                                                unique_name):
    """The process that started the listener closes; another resumes it: the runs it continues the listener
    as still use the start's model settings (read back from the server) and still show its signal."""
    tools = ActionTools()
    defined = scripted_llm.script(policy=listener_policy(act_on))
    chosen = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("resumed"), defined, tools, continuation=Continuation(max_turns=2))
    with AgentRuntime(agent_settings) as first:
        handle = first.start(agent, "Start listening.", model_settings=ModelSettings(model=chosen, max_tokens=33))
        scripted_llm.wait_for_requests(chosen, 1, timeout=60)
        eventually(lambda: waiting(agent_settings.server_url, handle), timeout=60, interval=0.2,
                   message="the listener waits for a message")
        handle.signal("Be terse.")
    with AgentRuntime(agent_settings) as second:
        resumed = second.resume(handle.execution_id, agent, force=True)  # the first runtime's worker is closed
        for action in ("r1", "r2", "r3"):
            act_and_check(resumed, tools, action)
        eventually(lambda: resumed.runs >= 2, timeout=60, interval=0.2, message="continued by the second runtime")
        act_and_check(resumed, tools, "r4")
        later = turn_after(scripted_llm, chosen, "r4")
        assert later.is_continuation and later.signal == "Be terse." and later.body["max_output_tokens"] == 33
        resumed.stop()
        assert resumed.wait(timeout=60).status is RunStatus.COMPLETED
    assert scripted_llm.requests_for(defined) == ()
