"""The seed scenario: a stateful listener agent that acts on external messages.

The agent loops *wait for a message → act on it → wait again*. Because it is stateful,
every tool task of the run is pinned to this process, so the tools that act on a
message run here, on this ``ActionTools`` instance, with its state.

Run it offline (a real Conductor server on this machine, with a scripted model):

    python samples/listener.py

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/listener.py --remote

Or against a local server with a scripted model, from the shell (no key; docs/quickstart.md):

    conductor-agents server start --scripted-model      # then export the two lines it prints
    python samples/listener.py --remote
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

from conductor_agents import (Agent, AgentRuntime, AgentSettings, Continuation, ToolRegistry, WaitForMessageTool,
                              tool)


class ActionTools:
    """What the agent can do. State lives on the instance: that is why the run is stateful."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        path = f"/reports/{topic}-{len(self.reports) + 1}.pdf"
        self.reports.append(path)
        print(f"  [tool] generate_report(topic={topic!r}) -> {path}")
        return {"saved_to": path}


def build_agent(model: str, tools: ActionTools) -> Agent:
    receive = WaitForMessageTool.create(
        name="wait_for_message",
        description="Wait for the next external message, then return its content.",
    )
    return Agent(
        name="listener",
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[receive, *ToolRegistry.from_instance(tools)],
        instructions="Loop: wait_for_message, act on it, repeat until told to stop.",
        # A listener that lives for months is continued as fresh runs; the server keeps its first run, at
        # most the 2 newest ended ones, and none that ended more than 30 days ago (docs/operations.md).
        continuation=Continuation(keep_runs=2, keep_for=timedelta(days=30)),
    )


def run_scenario(settings: AgentSettings, model: str) -> int:
    tools = ActionTools()
    agent = build_agent(model, tools)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        print(f"started {agent.name}: execution {handle.execution_id}")  # the one id to hold (send, status, stop)

        message_id = runtime.send_message(handle.execution_id, {"action": "generate-report"})
        print("sent {'action': 'generate-report'}")
        delivery = handle.wait_delivered(message_id, timeout=60)  # MessageLostError if it can never arrive
        print(f"delivered: run {handle.execution_id} read it ({delivery.task_reference_name})")
        deadline = time.monotonic() + 60
        while not tools.reports and time.monotonic() < deadline:
            time.sleep(0.1)

        handle.stop()
        result = handle.wait()
        print(f"run ended {result.status.value}; tool calls: "
              f"{[c.name for c in result.tool_calls]}; tokens: {result.token_usage.total_tokens}")
        print(f"reports generated in this process: {tools.reports}")
        return 0 if result.ok and tools.reports else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    args = parser.parse_args()
    if args.remote:
        model = os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6")
        return run_scenario(AgentSettings.from_env(), model)

    from conductor_agents.testing import LocalStack, ToolCall, listener_policy

    print("starting a local Conductor server with a scripted model...")  # a first run also says it downloads the jar
    with LocalStack() as stack:
        # The scripted model does what a real one would: turn {"action": "generate-report"}
        # into a generate_report call, and finish when the stop signal arrives.
        model = stack.llm.script(policy=listener_policy(
            lambda payload: ToolCall("generate_report", {"topic": "weekly"})
            if payload.get("action") == "generate-report" else None
        ))
        print(f"server up at {stack.url}")
        return run_scenario(stack.settings, model)


if __name__ == "__main__":
    raise SystemExit(main())
