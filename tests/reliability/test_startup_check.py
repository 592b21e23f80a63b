"""The start-up check: start() and resume() return only once the server has seen the run's
workers poll; when every poll fails they raise WorkerStartupError within
``worker_startup_timeout_seconds`` instead of returning a handle on a run nobody serves.

The polls fail because the runtime talks through a proxy that answers every
``/api/tasks/poll`` request with 503 itself; every other call reaches the real server.
"""

from __future__ import annotations

import time

import attrs
import pytest

from conductor_agents import Agent, AgentRuntime, RunStatus, ToolRegistry, WorkerStartupError
from conductor_agents.testing import ToolCall

from ..helpers import sdk_threads
from ..integration.test_stateful_listener import ActionTools
from ..proxy import LoopbackProxy

pytestmark = pytest.mark.reliability

STARTUP_TIMEOUT = 2.0
# start() sends POST /agent/start before it waits for the first poll, and the poller's last
# refused attempt may be in flight when the timeout passes: allow the requests' round trips.
REQUEST_SLACK = 2.0


def one_tool_agent(name: str, model: str, tools: ActionTools) -> Agent:
    return Agent(name, model, stateful=True, tools=list(ToolRegistry.from_instance(tools)), max_turns=5)


@pytest.fixture
def refusing_proxy(conductor_server, agent_settings, scripted_llm, unique_name):
    # The first POST /agent/start of a freshly started server takes seconds (class loading,
    # JIT); start one throwaway run first so the timing below measures the start-up check.
    with AgentRuntime(attrs.evolve(agent_settings, auto_start_workers=False)) as warm:
        warm.run(one_tool_agent(unique_name("warm_up"), scripted_llm.script(["done"]), ActionTools()),
                 "Go.", timeout=60)
    with LoopbackProxy(conductor_server.url) as proxy:
        proxy.refuse(["/api/tasks/poll"])
        yield proxy


def test_start_raises_worker_startup_error_when_no_poll_gets_through(
        agent_settings, refusing_proxy, scripted_llm, unique_name):
    model = scripted_llm.script(["done"])  # the run ends by itself: it needs no worker
    settings = attrs.evolve(agent_settings, server_url=refusing_proxy.url,
                            worker_startup_timeout_seconds=STARTUP_TIMEOUT)
    before = sdk_threads()
    with AgentRuntime(settings) as runtime:
        began = time.monotonic()
        with pytest.raises(WorkerStartupError) as info:
            runtime.start(one_tool_agent(unique_name("unreachable"), model, ActionTools()), "Go.")
        elapsed = time.monotonic() - began
    print(f"\nWorkerStartupError after {elapsed:.2f}s (timeout {STARTUP_TIMEOUT}s)")
    assert STARTUP_TIMEOUT <= elapsed <= STARTUP_TIMEOUT + REQUEST_SLACK
    assert refusing_proxy.refused > 0
    assert "did not reach the server" in str(info.value)
    assert info.value.execution_id  # the run exists: the caller can cancel or resume it
    assert sdk_threads() == before


def test_resume_raises_worker_startup_error_then_a_direct_resume_completes(
        agent_settings, refusing_proxy, scripted_llm, unique_name):
    model = scripted_llm.script([ToolCall("act", {"action": "later"}), "done"])
    name = unique_name("resume_check")
    with AgentRuntime(attrs.evolve(agent_settings, auto_start_workers=False)) as starter:
        execution_id = starter.start(one_tool_agent(name, model, ActionTools()), "Go.").execution_id

    blocked = attrs.evolve(agent_settings, server_url=refusing_proxy.url,
                           worker_startup_timeout_seconds=STARTUP_TIMEOUT)
    with AgentRuntime(blocked) as runtime:
        began = time.monotonic()
        with pytest.raises(WorkerStartupError):
            runtime.resume(execution_id, one_tool_agent(name, model, ActionTools()))
        elapsed = time.monotonic() - began
    assert elapsed <= STARTUP_TIMEOUT + REQUEST_SLACK

    tools = ActionTools("direct")
    with AgentRuntime(agent_settings) as runtime:
        result = runtime.resume(execution_id, one_tool_agent(name, model, tools)).wait(timeout=60)
    assert result.status is RunStatus.COMPLETED and tools.actions == [("later", "")]
