"""Unit tests for conductor_agents._tracing: off without the extra, the spans and metrics it makes, the
carrier a run keeps its trace context in, and a tool body run by the executor inside its span."""

import os
import subprocess
import sys
import textwrap

import pytest

from conductor_agents.errors import ExecutionNotFoundError

from conductor_agents import ConductorAgentsInstrumentor, tool
from conductor_agents._tracing import hooks
from conductor_agents._tracing.carrier import carrier_of, is_traceparent
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import Transport
from conductor_agents._worker.executor import ToolExecutor
from tests.helpers import eventually, otel_capture
from tests.unit.fakes import BASE_URL

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_nothing_imports_opentelemetry_without_the_extra():
    """With ``opentelemetry`` impossible to import, the package imports, a runtime is built and closed, the
    hooks are no-ops, and ``instrument()`` says which extra to install."""
    script = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import conductor_agents
        from conductor_agents import AgentRuntime, AgentSettings, ConductorAgentsInstrumentor
        from conductor_agents._tracing import hooks
        AgentRuntime(AgentSettings(server_url="http://127.0.0.1:9/api")).close()
        assert hooks.begin_run("a").traceparent is None
        with hooks.tool_call("wf", "t", call_id="c", attempt=1, read_workflow=None) as span:
            span.finished("COMPLETED")
        try:
            ConductorAgentsInstrumentor().instrument()
        except ImportError as err:
            assert "conductor-agents[otel]" in str(err), err
        else:
            raise AssertionError("instrument() without opentelemetry")
        assert not any(m.startswith("opentelemetry") for m in sys.modules), sorted(sys.modules)
        assert not ConductorAgentsInstrumentor().is_instrumented_by_opentelemetry
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_carrier_is_a_w3c_traceparent_in_the_runs_input():
    """Only a valid ``traceparent`` in ``input.session_id`` counts (an untraced run's is empty)."""
    assert carrier_of({"input": {"session_id": TRACEPARENT}}) == TRACEPARENT
    for value in ("", None, "00-" + "0" * 32 + "-b7ad6b7169203331-01", "hello", 7):
        assert carrier_of({"input": {"session_id": value}}) is None
        assert not is_traceparent(value)
    assert carrier_of({}) is None


def test_a_run_span_is_a_child_of_the_callers_span_and_carries_its_context():
    """``begin_run`` under the caller's span: its ``traceparent`` names the run's span in the caller's trace;
    the run's end records its model turns as chat spans with the server's times, and the metrics."""
    with otel_capture() as otel:
        with otel.tracer.start_as_current_span("caller") as caller:
            traced = hooks.begin_run("helper", owner="rt")
        traced.started("wf-1")
        trace_id = format(caller.get_span_context().trace_id, "032x")
        assert traced.traceparent.startswith(f"00-{trace_id}-")
        tasks = [{"taskType": "LLM_CHAT_COMPLETE", "status": "COMPLETED", "startTime": 1_000, "endTime": 3_500,
                  "referenceTaskName": "llm__1",
                  "inputData": {"model": "gpt-4o", "llmProvider": "openai"},
                  "outputData": {"promptTokens": 10, "completionTokens": 5, "finishReason": "STOP", "responseId": "r"}},
                 {"taskType": "LLM_CHAT_COMPLETE", "status": "FAILED", "startTime": 4_000, "endTime": 4_500,
                  "inputData": {"model": "gpt-4o"}, "outputData": {}},
                 {"taskType": "LLM_CHAT_COMPLETE", "status": "SCHEDULED"},
                 {"taskType": "act", "status": "COMPLETED", "startTime": 1, "endTime": 2}]
        hooks.run_ended("wf-1", lambda: {"status": "COMPLETED", "tasks": tasks})
        hooks.run_ended("wf-1", lambda: pytest.fail("read twice"))  # ended once only
        run, = [s for s in otel.spans() if s.name == "invoke_agent helper"]
        chats = sorted((s for s in otel.spans() if s.name == "chat gpt-4o"), key=lambda s: s.start_time)
        assert run.parent.span_id == caller.get_span_context().span_id
        assert run.attributes["conductor_agents.run.status"] == "COMPLETED" and run.status.is_ok
        assert [(c.start_time, c.end_time) for c in chats] == [(1_000_000_000, 3_500_000_000),
                                                               (4_000_000_000, 4_500_000_000)]
        assert dict(chats[0].attributes) == {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.provider.name": "openai",
            "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5,
            "gen_ai.response.finish_reasons": ("stop",), "gen_ai.response.id": "r",
            "conductor_agents.task.reference_name": "llm__1"}
        assert chats[1].attributes["error.type"] == "failed"
        assert all(c.parent.span_id == run.context.span_id for c in chats)
        tokens = {p.attributes["gen_ai.token.type"]: (p.sum, p.count) for p in otel.metric("gen_ai.client.token.usage")}
        assert tokens == {"input": (10, 1), "output": (5, 1)}
        durations = sorted((p.attributes["gen_ai.operation.name"], p.attributes.get("error.type", ""), p.count)
                           for p in otel.metric("gen_ai.client.operation.duration"))
        assert durations == [("chat", "", 1), ("chat", "failed", 1), ("invoke_agent", "", 1)]


def test_a_run_span_names_its_provider_and_model_as_the_genai_conventions_require():
    """``invoke_agent`` spans (CLIENT) and their duration metric carry ``gen_ai.provider.name``, required by the
    conventions since mid-2025, and the requested model, from the agent's ``provider/model``; a run whose model
    is not known (or not of that form) gets neither."""
    with otel_capture() as otel:
        hooks.begin_run("known", model="anthropic/claude-sonnet-4-6").started("wf-1")
        hooks.begin_run("unknown").started("wf-2")
        for run_id in ("wf-1", "wf-2"):
            hooks.run_ended(run_id, lambda: {"status": "COMPLETED", "tasks": []})
        spans = {s.name: s for s in otel.spans()}
        known, unknown = spans["invoke_agent known"].attributes, spans["invoke_agent unknown"].attributes
        assert (known["gen_ai.provider.name"], known["gen_ai.request.model"]) == ("anthropic", "claude-sonnet-4-6")
        assert "gen_ai.provider.name" not in unknown and "gen_ai.request.model" not in unknown
        providers = sorted(p.attributes.get("gen_ai.provider.name", "") for p in
                           otel.metric("gen_ai.client.operation.duration"))
        assert providers == ["", "anthropic"]


def test_sub_runs_get_their_spans_and_their_model_turns_theirs():
    """A sub-agent's run (and a sub-run of it) gets an ``invoke_agent`` span with the server's times under the run's
    span, and its model turns ``chat`` spans under it; a sub-run still going (no end) or unreadable gets none."""
    def turn(start, end):
        return {"taskType": "LLM_CHAT_COMPLETE", "status": "COMPLETED", "startTime": start, "endTime": end,
                "inputData": {"model": "gpt-4o", "llmProvider": "openai"}, "outputData": {}}

    runs = {"sub-1": {"workflowName": "researcher", "status": "COMPLETED",
                      "tasks": [turn(2_000, 2_500), {"taskType": "SUB_WORKFLOW", "subWorkflowId": "sub-2",
                                                     "startTime": 2_600, "endTime": 2_900}]},
            "sub-2": {"workflowName": "checker", "status": "FAILED", "tasks": [turn(2_700, 2_800)]}}
    tasks = [turn(1_000, 1_500),
             {"taskType": "SUB_WORKFLOW", "subWorkflowId": "sub-1", "startTime": 1_900, "endTime": 3_000},
             {"taskType": "SUB_WORKFLOW", "subWorkflowId": "sub-3", "startTime": 3_100},  # still going
             {"taskType": "SUB_WORKFLOW", "subWorkflowId": "gone", "startTime": 3_100, "endTime": 3_200}]

    def read_run(run_id):
        if run_id == "gone":
            raise ExecutionNotFoundError("no run gone", execution_id="gone")
        return runs[run_id]

    with otel_capture() as otel:
        hooks.begin_run("lead", model="openai/gpt-4o").started("wf-1")
        hooks.run_ended("wf-1", lambda: {"status": "COMPLETED", "tasks": tasks}, read_run=read_run)
        spans = {s.name: s for s in otel.spans() if s.name.startswith("invoke_agent")}
        lead, researcher, checker = (spans[f"invoke_agent {n}"] for n in ("lead", "researcher", "checker"))
        assert researcher.parent.span_id == lead.context.span_id and checker.parent.span_id == researcher.context.span_id
        assert (researcher.start_time, researcher.end_time) == (1_900_000_000, 3_000_000_000)
        assert researcher.attributes["conductor_agents.execution_id"] == "sub-1"
        assert checker.attributes["error.type"] == "failed" and not checker.status.is_ok
        chats = {s.parent.span_id for s in otel.spans() if s.name == "chat gpt-4o"}
        assert chats == {lead.context.span_id, researcher.context.span_id, checker.context.span_id}
        assert len(spans) == 3 and lead.attributes["conductor_agents.sub_runs_unread"].endswith("ExecutionNotFoundError")


def test_a_runs_model_is_its_settings_model_or_its_agents():
    from conductor_agents import ModelSettings
    from conductor_agents._teams.model_settings import run_model
    assert run_model("openai/gpt-4o", ModelSettings(model="openai/gpt-4o-mini")) == "openai/gpt-4o-mini"
    assert run_model("openai/gpt-4o", ModelSettings(temperature=0.1)) == "openai/gpt-4o"
    assert run_model("openai/gpt-4o", None) == "openai/gpt-4o"


@pytest.mark.parametrize("status,reason,error", [("TERMINATED", "continued as x", None),
                                                 ("TERMINATED", "stopped by hand", "terminated"),
                                                 ("FAILED", None, "failed")])
def test_a_runs_end_status(status, reason, error):
    """A failed or terminated run's span is an error; a listener's run continued by the next one is not."""
    with otel_capture() as otel:
        hooks.begin_run("a").started("wf-1")
        hooks.run_ended("wf-1", lambda: {"status": status, "reasonForIncompletion": reason, "tasks": []},
                        continued=lambda why: bool(why) and why.startswith("continued"))
        run, = otel.spans()
        assert run.attributes.get("error.type") == error
        assert run.attributes["conductor_agents.run.status"] == ("CONTINUED" if error is None else status)


def test_open_runs_end_when_their_runtime_closes_or_tracing_stops():
    """``runs_closed(owner)`` ends that owner's open spans only (marked open: the runs go on); uninstrumenting
    ends the rest; a run span whose start failed ends once, with the error."""
    with otel_capture() as otel:
        hooks.begin_run("mine", owner="rt-1").started("wf-1")
        hooks.begin_run("theirs", owner="rt-2").started("wf-2")
        hooks.begin_run("refused", owner="rt-1").failed(ConnectionError("no server"))
        hooks.runs_closed("rt-1")
        assert sorted(s.name for s in otel.spans()) == ["invoke_agent mine", "invoke_agent refused"]
        refused, = [s for s in otel.spans() if s.name == "invoke_agent refused"]
        assert refused.attributes["error.type"] == "ConnectionError"
    names = {s.name: s for s in otel.spans()}
    assert set(names) == {"invoke_agent mine", "invoke_agent refused", "invoke_agent theirs"}
    assert names["invoke_agent theirs"].attributes["conductor_agents.run.open"] is True


def test_a_tool_span_finds_the_run_it_belongs_to():
    """A tool of a run not started here nests under the carrier its run (or, for a sub-run, its nearest
    traced parent run) was started with; each run is read once; a run started here needs no read."""
    reads = []
    runs = {"sub": {"input": {"session_id": ""}, "parentWorkflowId": "top"},
            "top": {"input": {"session_id": TRACEPARENT}},
            "plain": {"input": {}}}

    def read(execution_id):
        reads.append(execution_id)
        return runs[execution_id]

    with otel_capture() as otel:
        for _ in range(2):
            with hooks.tool_call("sub", "lookup", call_id="call_1", attempt=2, read_workflow=read) as span:
                span.finished("COMPLETED")
        with hooks.tool_call("plain", "lookup", call_id="call_2", attempt=1, read_workflow=read):
            pass
        traced = hooks.begin_run("here")
        traced.started("local")
        with hooks.tool_call("local", "lookup", call_id="call_3", attempt=1, read_workflow=read):
            pass
        assert reads == ["sub", "top", "plain"]
        tools = [s for s in otel.spans() if s.name == "execute_tool lookup"]
        assert [format(s.parent.span_id, "016x") for s in tools[:2]] == ["b7ad6b7169203331"] * 2
        assert {format(s.context.trace_id, "032x") for s in tools[:2]} == {"0af7651916cd43dd8448eb211c80319c"}
        assert tools[2].parent is None  # untraced run: a root, not the thread's leftover context
        assert tools[3].parent.span_id == traced._run.span.get_span_context().span_id
        assert dict(tools[0].attributes) == {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": "call_1", "conductor_agents.tool.attempt": 2,
            "conductor_agents.execution_id": "sub", "conductor_agents.task.status": "COMPLETED"}


def test_the_executor_runs_a_tool_body_inside_its_span(http):
    """A body run by the executor sees its span as current (the user's spans nest under it); a body that
    raises leaves ``error.type`` and the exception on the span, with the run's secrets redacted; the run's
    carrier is read once."""
    http.add("GET", BASE_URL + "/workflow/wf-1", json={"workflowId": "wf-1", "input": {"session_id": TRACEPARENT}})
    http.add("POST", BASE_URL + "/tasks", body="")
    executor = ToolExecutor(ConductorApi(Transport(BASE_URL)), threads=2, worker_id="w")

    with otel_capture() as otel:
        @tool
        def lookup(city: str) -> str:
            """Look up a city."""
            with otel.tracer.start_as_current_span("mine"):
                if city == "Atlantis":
                    raise LookupError("no such city (tried with key sk-very-secret)")
                return city

        try:
            for number, city in enumerate(("Oslo", "Atlantis")):
                task = {"taskId": f"t-{number}", "workflowInstanceId": "wf-1", "taskType": "lookup",
                        "referenceTaskName": f"call_{number}", "inputData": {"city": city},
                        "runtimeMetadata": {"API_KEY": "sk-very-secret"}}
                assert executor.submit(task, lookup)
                eventually(lambda: executor.in_flight_count == 0, timeout=5.0, message="the tool to finish")
        finally:
            executor.close(grace=1.0)
    tools = sorted((s for s in otel.spans() if s.name == "execute_tool lookup"),
                   key=lambda s: s.attributes["gen_ai.tool.call.id"])
    mine = [s for s in otel.spans() if s.name == "mine"]
    assert len(tools) == 2 and len(mine) == 2
    assert sorted(m.parent.span_id for m in mine) == sorted(t.context.span_id for t in tools)
    assert all(format(t.parent.span_id, "016x") == "b7ad6b7169203331" for t in tools)
    assert "error.type" not in tools[0].attributes
    assert tools[1].attributes["error.type"] == "LookupError"
    assert tools[1].attributes["conductor_agents.task.status"] == "FAILED_WITH_TERMINAL_ERROR"
    event, = tools[1].events
    assert event.name == "exception" and event.attributes["exception.type"] == "LookupError"
    assert "no such city" in event.attributes["exception.message"]
    assert "sk-very-secret" not in repr([dict(s.attributes) for s in otel.spans()] + [dict(event.attributes)])
    assert [c.request.method for c in http.calls].count("GET") == 1


def test_instrument_is_idempotent_and_reversible():
    """``instrument()`` twice replaces the providers; ``uninstrument()`` turns every hook back into a no-op."""
    instrumentor = ConductorAgentsInstrumentor()
    with otel_capture():
        assert instrumentor.is_instrumented_by_opentelemetry
        first = hooks.active()
        with otel_capture():
            assert hooks.active() is not first
    assert not instrumentor.is_instrumented_by_opentelemetry
    assert hooks.begin_run("a") is hooks.NO_RUN
    instrumentor.uninstrument()  # again: nothing to do


def test_a_forked_child_starts_with_no_open_run_of_its_parent():
    """After ``fork()`` the child's instrumentation holds none of the parent's runs (and a fresh lock)."""
    with otel_capture():
        hooks.begin_run("a").started("wf-parent")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it holds, then leave at once
            os.write(write, repr(sorted(hooks.active()._runs)).encode())
            os._exit(0)
        os.close(write)
        held = os.read(read, 1000).decode()
        os.waitpid(pid, 0)
        assert held == "[]"
        assert list(hooks.active()._runs) == ["wf-parent"]
