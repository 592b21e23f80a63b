"""One id for every sender: a listener fed by plain HTTP pushes, across many continuations.

The listener is started with this SDK; the messages come from a "webhook" that knows nothing of it: a
``POST {server}/workflow/{execution_id}/messages`` with ``urllib`` (what another SDK, a webhook or the
Conductor UI would send). ``execution_id`` is the listener's *mailbox*, which lives as long as the listener,
so every push reaches it, exactly once, though the listener is continued as a fresh run every few turns
here. Once the listener has ended, a push answers 409. The push alone is enough: the server looks at the
mailbox after every push, and the mailbox takes the message at once. (One that lands within a second of the
mailbox's previous round is taken a moment later, at the serving process's next look; a sender that cannot wait
asks the server to look itself a second after its push: ``PUT {server}/workflow/decide/{execution_id}``.)

Run it offline (a real Conductor server on this machine, with a scripted model):

    python samples/webhook_sender.py

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/webhook_sender.py --remote
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request

from conductor_agents import Agent, AgentRuntime, AgentSettings, Continuation, ToolRegistry, WaitForMessageTool, tool

MESSAGES = 8


class ActionTools:
    def __init__(self) -> None:
        self.reports: list[str] = []

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        self.reports.append(topic)
        print(f"  [tool] generate_report(topic={topic!r})")
        return {"saved_to": f"/reports/{topic}.pdf"}


def post(url: str, payload: dict) -> int:
    """One HTTP POST of ``payload`` as JSON; the HTTP status."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def webhook_push(server_url: str, execution_id: str, payload: dict) -> int:
    """What a sender outside this SDK does: push the message; the push's HTTP status."""
    return post(f"{server_url}/workflow/{execution_id}/messages", payload)


def run_scenario(settings: AgentSettings, model: str) -> int:
    tools = ActionTools()
    agent = Agent(
        name="webhook_listener", model=model, stateful=True, max_turns=10_000,
        tools=[WaitForMessageTool.create(name="wait_for_message"), *ToolRegistry.from_instance(tools)],
        instructions="Loop: wait_for_message, act on it, repeat until told to stop.",
        continuation=Continuation(max_turns=4),  # continued every few turns, to show the id holds
    )
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        print(f"started; the one id for every sender: {handle.execution_id}")
        for i in range(MESSAGES):
            status = webhook_push(settings.server_url, handle.execution_id,
                                  {"action": "generate-report", "topic": f"topic-{i}"})
            deadline = time.monotonic() + 60
            while len(tools.reports) <= i and time.monotonic() < deadline:
                time.sleep(0.05)
            print(f"push {i}: HTTP {status}; the listener is in run {handle.runs}")
        handle.stop()
        result = handle.wait(timeout=120)
        late = webhook_push(settings.server_url, handle.execution_id, {"action": "generate-report", "topic": "late"})
        print(f"listener ended {result.status.value} after {result.runs} runs; a push now: HTTP {late}")
        print(f"reports: {tools.reports}")
        ok = tools.reports == [f"topic-{i}" for i in range(MESSAGES)] and late == 409
        return 0 if ok else 1


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
        return run_scenario(stack.settings, model)


if __name__ == "__main__":
    raise SystemExit(main())
