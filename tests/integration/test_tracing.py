"""OpenTelemetry on the real server (issue 33): the caller's span, the run's span, the tool's span and the
user's own span nest; a continued listener stays in one trace; the model turns become chat spans and the
GenAI metrics."""

from __future__ import annotations

import pytest

from conductor_agents import Agent, AgentRuntime, Continuation, tool
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener, otel_capture
from .test_long_listeners import ActionTools, act_on

pytestmark = pytest.mark.integration


def _named(spans, prefix: str) -> list:
    return [s for s in spans if s.name.startswith(prefix)]


def test_a_run_its_tool_and_the_callers_span_make_one_trace(agent_settings, scripted_llm, unique_name):
    """The caller's span is the run span's parent; the tool span nests under the run span, and the tool's own
    span under it; each model turn is a chat span with its tokens, and both GenAI metrics are recorded."""
    name = unique_name("add")

    with otel_capture() as otel:
        @tool(name=name)
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            with otel.tracer.start_as_current_span("inside the tool"):
                return a + b

        model = scripted_llm.script([[ToolCall(name, {"a": 2, "b": 3})], "It is 5."])
        agent = Agent(unique_name("calc"), model, tools=[add], max_turns=4)
        with AgentRuntime(agent_settings) as runtime:
            with otel.tracer.start_as_current_span("request") as request:
                handle = runtime.start(agent, "Add 2 and 3.")
            assert handle.wait(timeout=60).output == "It is 5."
            eventually(lambda: _named(otel.spans(), "invoke_agent"), timeout=10, message="the run span ended")
        spans = otel.spans()
        run, = _named(spans, f"invoke_agent {agent.name}")
        tool_span, = _named(spans, f"execute_tool {name}")
        inside, = _named(spans, "inside the tool")
        chats = _named(spans, "chat ")
        trace_id = request.get_span_context().trace_id
        assert {s.context.trace_id for s in (run, tool_span, inside, *chats)} == {trace_id}
        assert run.parent.span_id == request.get_span_context().span_id
        assert tool_span.parent.span_id == run.context.span_id
        assert inside.parent.span_id == tool_span.context.span_id
        assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert run.attributes["gen_ai.conversation.id"] == handle.execution_id
        assert run.attributes["conductor_agents.run.status"] == "COMPLETED"
        assert tool_span.attributes["gen_ai.tool.name"] == name
        assert tool_span.attributes["conductor_agents.tool.attempt"] == 1
        assert tool_span.attributes["gen_ai.tool.call.id"]
        assert "error.type" not in tool_span.attributes
        assert len(chats) == 2 and all(c.parent.span_id == run.context.span_id for c in chats)
        assert all(c.attributes["gen_ai.usage.input_tokens"] > 0 for c in chats)
        tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in otel.metric("gen_ai.client.token.usage")}
        assert tokens == {"input": sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats),
                          "output": sum(c.attributes["gen_ai.usage.output_tokens"] for c in chats)}
        operations = {p.attributes["gen_ai.operation.name"]: p.count
                      for p in otel.metric("gen_ai.client.operation.duration")}
        assert operations == {"chat": 2, "invoke_agent": 1}


@pytest.mark.both_topologies
def test_a_continued_listener_keeps_one_trace(agent_settings, scripted_llm, unique_name):
    """``Continuation(max_turns=2)``: the listener is continued; every run's span and every tool span is in
    the trace of the caller's span, the later run's span a child of the first run's."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("traced"), model, tools, continuation=Continuation(max_turns=2))
    with otel_capture() as otel:
        with AgentRuntime(agent_settings) as runtime:
            with otel.tracer.start_as_current_span("caller") as caller:
                handle = runtime.start(agent, "Start listening.")
            sent = 0
            while handle.runs < 2:
                assert sent < 10, "no switch"
                runtime.send_message(handle.execution_id, {"action": f"m{sent}"})
                sent += 1
                eventually(lambda: f"m{sent - 1}" in tools.actions, timeout=60, message="acted on")
            handle.stop()
            handle.wait(timeout=60)
        spans = otel.spans()
        runs = sorted(_named(spans, f"invoke_agent {agent.name}"), key=lambda s: s.start_time)
        acts = _named(spans, "execute_tool act")
        assert len(runs) >= 2 and len(acts) >= sent
        assert {s.context.trace_id for s in (*runs, *acts)} == {caller.get_span_context().trace_id}
        assert runs[0].parent.span_id == caller.get_span_context().span_id
        assert all(later.parent.span_id == runs[0].context.span_id for later in runs[1:])
        assert {a.parent.span_id for a in acts} <= {r.context.span_id for r in runs}
        assert runs[0].attributes["conductor_agents.run.status"] == "CONTINUED"
        assert "error.type" not in runs[0].attributes
        assert {r.attributes["gen_ai.conversation.id"] for r in runs} == {handle.execution_id}
        assert _named(spans, "chat ")
