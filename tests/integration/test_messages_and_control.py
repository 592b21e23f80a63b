"""send_message, stop and cancel against the real server."""

from __future__ import annotations

import pytest

from conductor_agents import (
    Agent,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    PayloadError,
    RunStatus,
    WaitForMessageTool,
)
from conductor_agents.testing import listener_policy

pytestmark = pytest.mark.integration


def waiting_agent(name: str, model: str) -> Agent:
    return Agent(name, model, tools=[WaitForMessageTool.create()], max_turns=50)


def test_messages_reach_the_model_in_their_normalised_form(agent_runtime, scripted_llm, unique_name):
    """A dict is sent as is, a string and other JSON values are wrapped as {"message": ...}."""
    seen = []

    def on_message(payload):
        seen.append(payload)
        return None

    model = scripted_llm.script(policy=listener_policy(on_message))
    handle = agent_runtime.start(waiting_agent(unique_name("inbox"), model), "Listen.")
    for payload in ({"k": [1, 2]}, "plain text", 42):
        handle.send_message(payload)
    scripted_llm.wait_for_requests(model, 4, timeout=60)
    handle.stop()
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    assert seen[:3] == [{"k": [1, 2]}, {"message": "plain text"}, {"message": 42}]


@pytest.mark.both_topologies
def test_stop_wakes_a_blocked_wait_for_message(agent_runtime, scripted_llm, unique_name):
    """stop() ends a run blocked in wait_for_message, COMPLETED."""
    model = scripted_llm.script(policy=listener_policy())
    handle = agent_runtime.start(waiting_agent(unique_name("blocked"), model), "Listen.")
    scripted_llm.wait_for_requests(model, 1, timeout=30)
    handle.stop()
    result = handle.wait(timeout=60)
    assert result.status is RunStatus.COMPLETED
    assert result.finish_reason is not None
    assert handle.wait(timeout=1) is result  # a second wait is safe and returns at once


@pytest.mark.both_topologies
def test_cancel_terminates_at_once_and_late_messages_are_refused(agent_runtime, scripted_llm, unique_name):
    """cancel() → TERMINATED with the reason; a message after that is ExecutionNotRunningError."""
    model = scripted_llm.script(policy=listener_policy())
    handle = agent_runtime.start(waiting_agent(unique_name("cancelled"), model), "Listen.")
    handle.cancel(reason="test says so")
    result = handle.wait(timeout=30)
    assert result.status is RunStatus.TERMINATED
    assert "test says so" in (result.error or "")
    with pytest.raises(ExecutionNotRunningError) as info:
        handle.send_message({"late": True})
    assert info.value.execution_id == handle.execution_id


def test_unknown_execution_and_bad_payloads(agent_runtime):
    """An unknown id is ExecutionNotFoundError; an unserialisable payload fails before any request."""
    with pytest.raises(ExecutionNotFoundError):
        agent_runtime.send_message("00000000-no-such-run", {"a": 1})
    with pytest.raises(ExecutionNotFoundError):
        agent_runtime.attach("00000000-no-such-run")
    with pytest.raises(PayloadError):
        agent_runtime.send_message("00000000-no-such-run", {"a": object()})
    with pytest.raises(TypeError):
        agent_runtime.send_message("00000000-no-such-run", {1: "non-string key"})
