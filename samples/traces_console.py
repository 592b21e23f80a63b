"""A listener's OpenTelemetry traces, printed by the console exporter: one trace across its continued runs.

The caller's span ("handle webhook") is the parent of the listener's first run span (``invoke_agent``);
each tool body runs inside an ``execute_tool`` span of its run; each model turn the server reports becomes
a ``chat`` span with its tokens; the run continued as a fresh run (``Continuation(max_turns=2)``) stays in
the same trace. The GenAI metrics (``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``) are
printed at the end. Needs the SDK: ``pip install 'conductor-agents[otel]' opentelemetry-sdk``.

Run it offline (a real Conductor server on this machine, with a scripted model):

    python samples/traces_console.py

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/traces_console.py --remote
"""

from __future__ import annotations

import argparse
import os
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from conductor_agents import (Agent, AgentRuntime, AgentSettings, ConductorAgentsInstrumentor, Continuation,
                              ToolRegistry, WaitForMessageTool, tool)

#: The attributes each printed span line shows (all of them are on the span).
SHOWN = ("gen_ai.tool.name", "conductor_agents.tool.attempt", "gen_ai.request.model", "gen_ai.usage.input_tokens",
         "gen_ai.usage.output_tokens", "conductor_agents.run.status", "error.type")


def _short(key: str) -> str:
    return key.replace("gen_ai.", "").replace("conductor_agents.", "")


def one_line(span: ReadableSpan) -> str:
    """A span on one line: trace, span and parent ids (8 hex digits each), name, the attributes above."""
    parent = format(span.parent.span_id, "016x")[:8] if span.parent else "-" * 8
    shown = " ".join(f"{_short(k)}={span.attributes[k]}" for k in SHOWN if k in span.attributes)
    return (f"trace {format(span.context.trace_id, '032x')[:8]}  span {format(span.context.span_id, '016x')[:8]}"
            f"  parent {parent}  {span.name:<34} {shown}\n")


def one_metric_line(data) -> str:
    """The GenAI histograms: count and sum per attribute set."""
    lines = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    keys = {_short(k): v for k, v in point.attributes.items()}
                    lines.append(f"metric {metric.name} {keys} count={point.count} sum={point.sum:g}\n")
    return "".join(lines)


class ActionTools:
    """What the agent can do; each call runs in this process, inside its execute_tool span."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        self.reports.append(f"/reports/{topic}-{len(self.reports) + 1}.pdf")
        return {"saved_to": self.reports[-1]}


def build_agent(model: str, tools: ActionTools) -> Agent:
    return Agent(
        name="traced_listener",
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(tools)],
        instructions="Loop: wait_for_message, act on it, repeat until told to stop.",
        continuation=Continuation(max_turns=2),  # continued as a fresh run every two turns: to show one trace
    )


def run_scenario(settings: AgentSettings, model: str) -> int:
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=one_line)))
    meters = MeterProvider(metric_readers=[PeriodicExportingMetricReader(
        ConsoleMetricExporter(formatter=one_metric_line), export_interval_millis=3_600_000)])
    instrumentor = ConductorAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracers, meter_provider=meters)
    tools = ActionTools()
    try:
        with AgentRuntime(settings) as runtime:
            with tracers.get_tracer("sample").start_as_current_span("handle webhook"):
                handle = runtime.start(build_agent(model, tools), "Start listening.")
            sent = 0
            while handle.runs < 2 and sent < 6:  # until it was continued once
                message_id = runtime.send_message(handle.execution_id, {"action": "generate-report",
                                                                        "topic": f"t{sent}"})
                sent += 1
                handle.wait_delivered(message_id, timeout=60)
                deadline = time.monotonic() + 60
                while len(tools.reports) < sent and time.monotonic() < deadline:
                    time.sleep(0.1)
            handle.stop()
            result = handle.wait(timeout=120)
        print(f"run ended {result.status.value} after {handle.runs} runs; reports: {tools.reports}")
        return 0 if result.ok and handle.runs >= 2 else 1
    finally:
        instrumentor.uninstrument()
        tracers.shutdown()
        meters.shutdown()  # prints the metrics once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    args = parser.parse_args()
    if args.remote:
        return run_scenario(AgentSettings.from_env(), os.environ.get("CONDUCTOR_AGENT_MODEL",
                                                                     "anthropic/claude-sonnet-4-6"))

    from conductor_agents.testing import LocalStack, ToolCall, listener_policy

    print("starting a local Conductor server with a scripted model...")
    with LocalStack() as stack:
        model = stack.llm.script(policy=listener_policy(
            lambda payload: ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
            if payload.get("action") == "generate-report" else None))
        return run_scenario(stack.settings, model)


if __name__ == "__main__":
    raise SystemExit(main())
