"""The seed listener on a cluster: two Conductor nodes sharing Redis behind HAProxy.

Nothing in the agent or the runtime changes: the runtime gets the balancer's URL. Here one
node is SIGKILLed while the listener waits, and the run goes on through the other one.

Offline (starts redis-server, two server nodes and HAProxy on loopback, with a scripted
model; needs the `redis-server` and `haproxy` packages):

    python samples/cluster.py

Against a cluster you run (no node is killed then):

    CONDUCTOR_SERVER_URL=http://balancer:8080/api CONDUCTOR_AGENT_MODEL=openai/gpt-4o python samples/cluster.py --remote
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Callable, Optional

from conductor_agents import Agent, AgentRuntime, AgentSettings, ToolRegistry, WaitForMessageTool, tool


class ActionTools:
    """Tool state lives here, in the process serving the run, whichever node the requests reach."""

    def __init__(self) -> None:
        self.reports: list[str] = []
        self.made = threading.Condition()

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        with self.made:
            self.reports.append(f"/reports/{topic}.pdf")
            self.made.notify_all()
        print(f"  [tool] generate_report(topic={topic!r})")
        return {"saved_to": f"/reports/{topic}.pdf"}

    def wait_for(self, count: int, timeout: float) -> bool:
        with self.made:
            return self.made.wait_for(lambda: len(self.reports) >= count, timeout)


def build_agent(model: str, tools: ActionTools) -> Agent:
    receive = WaitForMessageTool.create(name="wait_for_message")
    return Agent(name="cluster_listener", model=model, stateful=True, max_turns=10_000,
                 tools=[receive, *ToolRegistry.from_instance(tools)],
                 instructions="Loop: wait_for_message, act on it, repeat until told to stop.")


def run_scenario(settings: AgentSettings, model: str, kill_a_node: Optional[Callable[[], None]] = None) -> int:
    tools = ActionTools()
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(build_agent(model, tools), "Start listening.")
        print(f"started {handle.execution_id} through {settings.server_url}")
        handle.send_message({"action": "generate-report", "topic": "before"})
        tools.wait_for(1, 120)
        if kill_a_node is not None:
            kill_a_node()
            print("node 1 SIGKILLed; the balancer sends everything to node 2")
        handle.send_message({"action": "generate-report", "topic": "after"})
        tools.wait_for(2, 120)
        handle.stop()
        result = handle.wait(timeout=300)
        print(f"run ended {result.status.value}; reports made in this process: {tools.reports}")
        return 0 if result.ok and len(tools.reports) == 2 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local cluster")
    args = parser.parse_args()
    if args.remote:
        return run_scenario(AgentSettings.from_env(), os.environ.get("CONDUCTOR_AGENT_MODEL", "openai/gpt-4o"))

    from conductor_agents.testing import LocalCluster, ScriptedLLM, ToolCall, listener_policy

    print("starting Redis, two Conductor nodes and HAProxy on loopback (a minute or two)...")
    with ScriptedLLM() as llm, LocalCluster(nodes=2, env=llm.server_env()) as cluster:
        model = llm.script(policy=listener_policy(
            lambda payload: ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
            if payload.get("action") == "generate-report" else None
        ))
        print(f"cluster up: balancer {cluster.url}, nodes {', '.join(cluster.node_urls)}")
        settings = AgentSettings.from_env(server_url=cluster.url)
        return run_scenario(settings, model, kill_a_node=lambda: cluster.kill_node(0))


if __name__ == "__main__":
    raise SystemExit(main())
