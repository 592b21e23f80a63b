"""Non-stateful runs and what happens to a tool's result, on the real server."""

from __future__ import annotations

import threading

import pytest

from conductor_agents import Agent, AgentRuntime, RunStatus, tool
from conductor_agents.testing import ToolCall

from ..helpers import sdk_threads

pytestmark = pytest.mark.integration


@pytest.mark.both_topologies
def test_non_stateful_agent_with_two_tools_returns_the_scripted_text(agent_runtime, scripted_llm, unique_name):
    """run() with two plain tools: both run here, the model sees their outputs, the final text comes back."""
    add_name, mul_name = unique_name("add"), unique_name("mul")
    seen = []

    @tool(name=add_name)
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        seen.append(("add", a, b, threading.current_thread().name))
        return a + b

    @tool(name=mul_name)
    def mul(a: float, b: float) -> dict:
        """Multiply two numbers."""
        seen.append(("mul", a, b, threading.current_thread().name))
        return {"product": a * b}

    model = scripted_llm.script([
        [ToolCall(add_name, {"a": 2, "b": 3}), ToolCall(mul_name, {"a": 4, "b": 2.5})],
        "The sum is 5 and the product is 10.",
    ])
    agent = Agent(unique_name("calc"), model, tools=[add, mul], max_turns=5)
    assert not agent.is_stateful
    result = agent_runtime.run(agent, "Compute things.", timeout=60)

    assert result.status is RunStatus.COMPLETED
    assert result.output == "The sum is 5 and the product is 10."
    assert sorted(s[:3] for s in seen) == [("add", 2, 3), ("mul", 4, 2.5)]
    assert all(s[3].startswith("conductor-agents-tool") for s in seen)
    second = scripted_llm.requests_for(model)[1]
    outputs = {o.name: o.output for o in second.tool_outputs}
    assert outputs == {add_name: {"result": 5}, mul_name: {"product": 10.0}}
    assert result.token_usage.total_tokens > 0
    assert {c.name for c in result.tool_calls} == {add_name, mul_name}


def test_a_failing_tool_is_reported_to_the_model_and_the_run_goes_on(agent_runtime, scripted_llm, unique_name):
    """A tool that raises, bad arguments and an unserialisable return are FAILED; the model sees why."""
    boom_name, strict_name, odd_name = unique_name("boom"), unique_name("strict"), unique_name("odd")
    called = []

    @tool(name=boom_name)
    def boom() -> str:
        """Always fails."""
        called.append("boom")
        raise RuntimeError("the disk is on fire")

    @tool(name=strict_name)
    def strict(count: int) -> str:
        """Needs an int."""
        called.append("strict")
        return "fine"

    @tool(name=odd_name)
    def odd() -> object:
        """Returns something JSON cannot hold."""
        called.append("odd")
        return {"when": object()}

    model = scripted_llm.script([
        [ToolCall(boom_name), ToolCall(strict_name, {"count": "many"}), ToolCall(odd_name)],
        "I noticed the failures.",
    ])
    result = agent_runtime.run(Agent(unique_name("faulty"), model, tools=[boom, strict, odd]), "Go.", timeout=90)

    assert result.status is RunStatus.COMPLETED
    assert result.output == "I noticed the failures."
    assert sorted(called) == ["boom", "odd"]  # the body with bad arguments was never called
    calls = {c.name: c for c in result.tool_calls}
    # An optional task that failed ends COMPLETED_WITH_ERRORS; a terminal error means no retry,
    # which the exactly-once list of calls above proves.
    assert {calls[n].status for n in (boom_name, strict_name, odd_name)} == {"COMPLETED_WITH_ERRORS"}
    assert "RuntimeError: the disk is on fire" in calls[boom_name].error
    assert "count" in calls[strict_name].error and "int" in calls[strict_name].error
    assert "JSON" in calls[odd_name].error
    seen_by_model = {o.name: str(o.output) for o in scripted_llm.requests_for(model)[1].tool_outputs}
    assert "the disk is on fire" in seen_by_model[boom_name]


def test_same_stateful_agent_started_twice_gives_two_independent_runs(agent_runtime, scripted_llm, unique_name):
    """Starting one stateful agent twice gives two runs on two domains, each served."""
    ping_name = unique_name("ping")
    ran = []

    @tool(name=ping_name, stateful=True)
    def ping(n: int) -> int:
        """Ping."""
        ran.append(n)
        return n

    model = scripted_llm.script(policy=lambda req: "done" if req.tool_outputs else ToolCall(ping_name, {"n": 1}))
    agent = Agent(unique_name("pinger"), model, tools=[ping])
    assert agent.is_stateful  # a stateful tool marks the agent stateful
    first = agent_runtime.start(agent, "one")
    second = agent_runtime.start(agent, "two")
    assert first.execution_id != second.execution_id and first.run_id != second.run_id
    assert first.wait(timeout=60).status is RunStatus.COMPLETED
    assert second.wait(timeout=60).status is RunStatus.COMPLETED
    assert ran == [1, 1]


def test_close_joins_every_thread_the_runtime_started(agent_settings, scripted_llm, unique_name):
    """After close() no conductor-agents thread is alive."""
    echo_name = unique_name("echo")

    @tool(name=echo_name)
    def echo(text: str) -> str:
        """Echo."""
        return text

    model = scripted_llm.script(policy=lambda req: "ok" if req.tool_outputs else ToolCall(echo_name, {"text": "x"}))
    before = sdk_threads()
    runtime = AgentRuntime(agent_settings)
    assert runtime.run(Agent(unique_name("echoer"), model, tools=[echo]), "hi", timeout=60).ok
    runtime.close()
    runtime.close()  # idempotent
    assert sdk_threads() == before
