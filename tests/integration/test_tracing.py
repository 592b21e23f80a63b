"""OpenTelemetry on the real server (issue 33): the caller's span, the run's span, the tool's span and the
user's own span nest; a continued listener stays in one trace; the model turns become chat spans and the
GenAI metrics."""

from __future__ import annotations

import pytest

from conductor_agents import Agent, AgentRuntime, Continuation, tool
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener, otel_capture
from .test_long_listeners import ActionTools, act_on
from .test_subagents import LookupTools, caller_policy, specialist_policy

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
        assert (run.attributes["gen_ai.provider.name"], run.attributes["gen_ai.request.model"]) == tuple(
            agent.model.split("/", 1))
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
def test_a_continued_listener_keeps_one_trace_also_when_resumed_elsewhere(agent_settings, scripted_llm, unique_name):
    """``Continuation(max_turns=2)``: the listener is continued, then its runtime closes and another resumes
    it. Every run span, the taker's span and every tool span are in the trace of the caller's span; the later
    run's span is a child of the first run's, the taker's a child of the run it took up, and the tool run
    after the resume nests under the taker's span."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("traced"), model, tools, continuation=Continuation(max_turns=2))

    def act(runtime: AgentRuntime, execution_id: str, action: str) -> None:
        runtime.send_message(execution_id, {"action": action})
        eventually(lambda: action in tools.actions, timeout=60, message=f"{action} acted on")

    with otel_capture() as otel:
        with AgentRuntime(agent_settings) as first:
            with otel.tracer.start_as_current_span("caller") as caller:
                handle = first.start(agent, "Start listening.")
            while handle.runs < 2:
                assert len(tools.actions) < 10, "no switch"
                act(first, handle.execution_id, f"m{len(tools.actions)}")
            eventually(lambda: [s for s in otel.spans()
                                if s.attributes.get("conductor_agents.run.status") == "CONTINUED"],
                       timeout=30, message="the switch committed: the first run's span ended")
        with AgentRuntime(agent_settings) as taker:
            resumed = taker.resume(handle.execution_id, agent, force=True)
            act(taker, handle.execution_id, "after the resume")
            resumed.stop()
            resumed.wait(timeout=60)
        spans = otel.spans()
        runs = sorted((s for s in _named(spans, f"invoke_agent {agent.name}")
                       if "conductor_agents.run.taken_up" not in s.attributes), key=lambda s: s.start_time)
        took, = [s for s in spans if s.attributes.get("conductor_agents.run.taken_up") == "resume"]
        acts = _named(spans, "execute_tool act")
        assert len(runs) >= 2 and len(acts) == len(tools.actions)
        assert {s.context.trace_id for s in (*runs, took, *acts)} == {caller.get_span_context().trace_id}
        assert runs[0].parent.span_id == caller.get_span_context().span_id
        assert runs[1].parent.span_id == runs[0].context.span_id  # runs continued after the resume: of runs[1]
        assert all(later.parent.span_id in {r.context.span_id for r in runs} for later in runs[1:])
        assert runs[0].attributes["conductor_agents.run.status"] == "CONTINUED"
        assert "error.type" not in runs[0].attributes
        before = [r for r in runs if r.start_time < took.start_time][-1]  # the run taken up
        assert before.attributes["conductor_agents.run.open"] is True  # its runtime closed; the run went on
        assert took.parent.span_id == before.context.span_id
        last_act = max(acts, key=lambda s: s.start_time)
        assert last_act.parent.span_id in {took.context.span_id, runs[-1].context.span_id}
        assert {r.attributes["gen_ai.conversation.id"] for r in (*runs, took)} == {handle.execution_id}
        assert {r.attributes["gen_ai.provider.name"] for r in (*runs, took)} == {"openai"}  # later runs, take-ups
        assert _named(spans, "chat ")


def test_a_sub_agents_run_and_its_model_turns_nest_under_the_run(agent_runtime, scripted_llm, unique_name):
    """An agent tool's sub-run (the server runs it) gets its ``invoke_agent`` span under the run's span, with the
    server's times, and its model turns their ``chat`` spans under it; the tool it called here stays a child of
    the run that started it."""
    tools = LookupTools("here")
    specialist = Agent(name=unique_name("specialist"), model=scripted_llm.script(policy=specialist_policy),
                       tools=[tools.lookup])
    parent = Agent(name=unique_name("caller"), model=scripted_llm.script(policy=caller_policy("ask")),
                   tools=[specialist.as_tool(name="ask")])
    with otel_capture() as otel:
        assert agent_runtime.run(parent, "Please handle run-solo-1.", timeout=120).output.startswith("final")
        eventually(lambda: _named(otel.spans(), f"invoke_agent {parent.name}"), timeout=10,
                   message="the run span ended")
        spans = otel.spans()
    run, = _named(spans, f"invoke_agent {parent.name}")
    sub, = [s for s in _named(spans, "invoke_agent ") if s is not run]
    assert sub.parent.span_id == run.context.span_id and sub.attributes["conductor_agents.run.status"] == "COMPLETED"
    assert run.start_time < sub.start_time < sub.end_time <= run.end_time
    chats = _named(spans, "chat ")
    assert {c.parent.span_id for c in chats} == {run.context.span_id, sub.context.span_id}
