"""The listener agent, its tools, and this process's runtime and listeners.

One :class:`AgentRuntime` per process, built once when Django is ready
(:class:`~listeners_site.apps.ListenersConfig`). With ``gunicorn --preload`` that happens in
the master before it forks the workers: each worker then uses the inherited runtime as its
own (a new worker id, connection pool and threads, built on first use in the worker), so
nothing is shared between processes. Without ``--preload`` each worker builds its own.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Optional, Tuple

from conductor_agents import Agent, AgentHandle, AgentRuntime, ToolRegistry, WaitForMessageTool, tool


class ActionTools:
    """One listener's tools and their state; they run in the process that started the listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: list[str] = []
        self.published: list[str] = []

    @tool
    def generate_report(self, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        with self._lock:
            self.reports.append(topic)
        return {"saved_to": f"/reports/{topic}.pdf", "pid": os.getpid()}

    @tool(approval_required=True)
    def publish_report(self, topic: str) -> dict:
        """Publish a report to customers (a person approves each publication first)."""
        with self._lock:
            self.published.append(topic)
        return {"published": f"https://example.com/reports/{topic}", "pid": os.getpid()}


AGENT_NAME = "django_listener"


def build_agent(tools: ActionTools) -> Agent:
    return Agent(
        name=AGENT_NAME,
        model=os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6"),
        stateful=True,
        max_turns=10_000,
        tools=[
            WaitForMessageTool.create(name="wait_for_message",
                                      description="Wait for the next external message, then return its content."),
            *ToolRegistry.from_instance(tools),
        ],
        instructions="Loop: wait_for_message; for {action: generate-report, topic}, call generate_report "
                     "with that topic; for {action: publish-report, topic}, call publish_report; repeat until "
                     "told to stop.",
    )


#: Set once by ListenersConfig.ready(); the pid records which process built it.
runtime: Optional[AgentRuntime] = None
runtime_built_in_pid: Optional[int] = None

#: execution id -> (handle, tools) of the listeners this process started (their tools run here).
listeners: Dict[str, Tuple[AgentHandle, ActionTools]] = {}
listeners_lock = threading.Lock()


def the_runtime() -> AgentRuntime:
    if runtime is None:
        raise RuntimeError("the listeners app is not ready (is it in INSTALLED_APPS?)")
    return runtime
