"""Steering a running listener: per-run model settings, and a standing signal that outlives its runs.

The listener is started with ``ModelSettings`` (a lower temperature and a token limit for this run only:
the agent definition is unchanged) and, while it runs, told ``handle.signal(...)``: a standing note the
server puts before every later model turn, also in the fresh runs the listener is continued as (every
few turns here). ``signal("")`` clears it; a signal to the ended listener is refused.

Run it offline (a real Conductor server on this machine, with a scripted model; it also prints the
signal each model turn was shown):

    python samples/steering.py

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/steering.py --remote
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Optional

from conductor_agents import (Agent, AgentRuntime, AgentSettings, Continuation, ExecutionNotRunningError,
                              ModelSettings, ToolRegistry, WaitForMessageTool, tool)

NOTE = "The board reads these reports: keep each one under a page."


class ReportTools:
    def __init__(self) -> None:
        self.reports: list[str] = []

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        self.reports.append(topic)
        print(f"  [tool] generate_report(topic={topic!r})")
        return {"saved_to": f"/reports/{topic}.pdf"}


def run_scenario(settings: AgentSettings, model: str, seen: Optional[Callable[[], Any]] = None) -> int:
    tools = ReportTools()
    agent = Agent(
        name="steered_listener", model=model, stateful=True, max_turns=10_000,
        tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(tools)],
        instructions="Loop: wait_for_message, act on it, repeat until told to stop.",
        continuation=Continuation(max_turns=3),  # continued every few turns, to show the signal goes along
    )

    def report(topic: str) -> None:
        handle.send_message({"action": "generate-report", "topic": topic})
        deadline = time.monotonic() + 60
        while topic not in tools.reports and time.monotonic() < deadline:
            time.sleep(0.05)

    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start listening.", model_settings=ModelSettings(temperature=0.2,
                                                                                       max_tokens=2048))
        handle.signal(NOTE)
        print(f"started {handle.execution_id}; signal set: {NOTE!r}")
        for topic in ("sales", "costs", "hiring"):
            report(topic)
        print(f"the listener is in run {handle.runs}")
        handle.signal("")
        print("signal cleared")
        report("outlook")
        handle.stop()
        result = handle.wait(timeout=120)
        try:
            handle.signal("too late")
            refused = False
        except ExecutionNotRunningError:
            refused = True
        print(f"listener ended {result.status.value} after {result.runs} runs; a signal now is refused: {refused}")
        print(f"reports: {tools.reports}")
        if seen is not None:
            print("signals the model was shown, turn by turn:", seen())
        return 0 if tools.reports == ["sales", "costs", "hiring", "outlook"] and refused else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    args = parser.parse_args()
    if args.remote:
        return run_scenario(AgentSettings.from_env(), os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6"))

    from conductor_agents.testing import LocalStack, ToolCall, listener_policy

    print("starting a local Conductor server with a scripted model (first run downloads the server)...")
    with LocalStack() as stack:
        model = stack.llm.script(policy=listener_policy(
            lambda payload: ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})))
        return run_scenario(stack.settings, model, seen=lambda: [r.signal for r in stack.llm.requests_for(model)])


if __name__ == "__main__":
    raise SystemExit(main())
