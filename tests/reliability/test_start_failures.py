"""start(): a failure after the server accepted the run raises an error carrying its execution_id,
releases what was reserved and leaves no thread serving the run (issue 11, point 3).

The failures are made by the loopback proxy: every request reaches the real server except the one
the test refuses (a 503, or a connection closed without an answer).
"""

from __future__ import annotations

import threading

import attrs
import pytest

from conductor_agents import AgentRuntime, WorkerStartupError
from conductor_agents.errors import ServerError, ServerUnavailableError
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..integration.test_stateful_listener import ActionTools, act_on
from ..proxy import LoopbackProxy
from .support import server_get

pytestmark = pytest.mark.reliability


@pytest.fixture
def proxy(conductor_server):
    with LoopbackProxy(conductor_server.url) as running:
        yield running


def _pollers():
    return [t for t in sdk_threads() if t.startswith("conductor-agents-poll-")]


@pytest.mark.parametrize("refused,status,idempotent,cause", [
    ("/api/workflow/", 503, True, ServerError),              # the idempotent domain lookup
    ("/api/tasks/queue/polldata", 503, False, ServerError),  # the start-up check's poll data
    ("/api/tasks/queue/polldata", 0, False, ServerUnavailableError),  # ... a connection closed unanswered
], ids=["domain-lookup-503", "poll-data-503", "poll-data-connection-error"])
def test_a_failure_after_the_start_names_the_run_and_serves_nothing(
        conductor_server, agent_settings, proxy, scripted_llm, unique_name, refused, status, idempotent, cause):
    model = scripted_llm.script(policy=listener_policy(act_on))
    settings = attrs.evolve(agent_settings, server_url=proxy.url)
    proxy.refuse([refused], status=status)
    with AgentRuntime(settings) as runtime:
        with pytest.raises(WorkerStartupError) as info:
            runtime.start(listener(unique_name("half_started"), model, ActionTools()), "Start listening.",
                          idempotency_key=unique_name("key") if idempotent else None)
        execution_id = info.value.execution_id
        assert execution_id, "the error names the run the server started"
        assert isinstance(info.value.__cause__, cause)
        assert proxy.refused >= 1
        run = server_get(conductor_server.url, f"/workflow/{execution_id}")
        assert run["status"] == "RUNNING"  # the run does exist: the caller can cancel or resume it
        eventually(lambda: not _pollers(), timeout=15, message="no poller left serving the run")
        assert runtime.stats().active_runs == ()
        proxy.refuse([])
        runtime.attach(execution_id).cancel("test cleanup")


@pytest.mark.parametrize("kind", ["plain", "listener"])
def test_a_start_whose_answer_is_lost_gives_the_one_run_it_made(
        conductor_server, agent_settings, proxy, scripted_llm, unique_name, kind):
    """The server started the run but its answer was lost on the way back (issue 44): start() sends the same keyed
    start again and returns the run the server made; no second run exists. A plain start carries the SDK's own key,
    a listener its first link's."""
    from conductor_agents import Agent, tool
    from conductor_agents.testing import ToolCall

    notes = []
    gate = threading.Event()  # the run is held in its tool until the test has counted the runs

    @tool
    def take_note(text: str) -> str:
        """Take a note."""
        gate.wait(60)  # bounded
        notes.append(text)
        return "noted"

    name = unique_name(kind)
    if kind == "plain":
        agent = Agent(name=name, model=scripted_llm.script([ToolCall("take_note", {"text": "a"}), "done"]),
                      tools=[take_note])
    else:
        tools = ActionTools()
        agent = listener(name, scripted_llm.script(policy=listener_policy(act_on)), tools)
    settings = attrs.evolve(agent_settings, server_url=proxy.url)
    proxy.lose_answers("/agent/start")
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "go" if kind == "plain" else "Start listening.")
        # Lost once, sent again (once more when the resend met the run's first decide: the server's lock answer).
        assert proxy.lost == 1 and len(proxy.requests_to("/agent/start")) >= 2
        running = server_get(conductor_server.url, f"/workflow/running/{name}")
        assert len(running) == 1, running  # the one run, not a second one
        gate.set()
        if kind == "plain":
            result = handle.wait(timeout=60)
            assert result.ok and notes == ["a"]
            assert running == [handle.execution_id]
        else:
            handle.send_message({"action": "after-a-lost-answer"})
            eventually(lambda: [a for a, _ in tools.actions] == ["after-a-lost-answer"], timeout=60,
                       message="the listener acts on a message, in this process")
            handle.stop()
            assert handle.wait(timeout=60).ok
