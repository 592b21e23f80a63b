"""The listener agent, its tools, and this process's runtime, which serves the agent.

One :class:`AgentRuntime` per process, built once when Django is ready
(:class:`~listeners_site.apps.ListenersConfig`), which calls ``runtime.serve(AGENT)``: every
worker process serves the listeners it starts *and* adopts the listeners of a worker that went
away (gunicorn ``--max-requests``, a deploy, a crash), so a listener lives as long as any worker
does. Exactly one process serves a listener at any time. With ``gunicorn --preload`` the runtime
is built in the master before it forks the workers: each worker then uses it as its own (a new
worker id, connection pool and threads) and serves the agent too (the master as well).

The tools' state is per listener, keyed by the run id (``ctx.run_id``: the same for the whole
life of a listener, across continuations and adoptions); it lives in the process that serves
the listener. After an adoption the new process starts with empty state for that listener
(``on_adopt`` is the place to rebuild it from your own store): the reports below are what *this*
process did for it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Dict, List, Optional

from conductor_agents import Agent, AgentHandle, AgentRuntime, ToolContext, ToolRegistry, WaitForMessageTool, tool

log = logging.getLogger("listeners_site")


class ActionTools:
    """The listener's tools, shared by every listener this process serves; state kept per listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: Dict[str, List[str]] = {}
        self.published: Dict[str, List[str]] = {}

    @tool
    def generate_report(self, ctx: ToolContext, topic: str = "weekly") -> dict:
        """Generate a report on a topic and return where it was saved."""
        with self._lock:
            self.reports.setdefault(ctx.run_id or ctx.execution_id, []).append(topic)
        return {"saved_to": f"/reports/{topic}.pdf", "pid": os.getpid()}

    @tool(approval_required=True)
    def publish_report(self, ctx: ToolContext, topic: str) -> dict:
        """Publish a report to customers (a person approves each publication first)."""
        with self._lock:
            self.published.setdefault(ctx.run_id or ctx.execution_id, []).append(topic)
        return {"published": f"https://example.com/reports/{topic}", "pid": os.getpid()}

    def state_of(self, run_id: str) -> "Optional[tuple[List[str], List[str]]]":
        with self._lock:
            if run_id not in self.reports and run_id not in self.published:
                return None
            return list(self.reports.get(run_id, ())), list(self.published.get(run_id, ()))


AGENT_NAME = "django_listener"
TOOLS = ActionTools()


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


#: Built once ready() runs (the model comes from the environment then).
AGENT: Optional[Agent] = None

#: Set once by ListenersConfig.ready(); the pid records which process built it.
runtime: Optional[AgentRuntime] = None
runtime_built_in_pid: Optional[int] = None


def adopted(handle: AgentHandle) -> None:
    """``runtime.serve(AGENT, on_adopt=adopted)``: a listener whose process went away is served here now."""
    log.warning("pid %d adopted listener %s", os.getpid(), handle.execution_id)


def the_runtime() -> AgentRuntime:
    if runtime is None:
        raise RuntimeError("the listeners app is not ready (is it in INSTALLED_APPS?)")
    return runtime


def the_agent() -> Agent:
    if AGENT is None:
        raise RuntimeError("the listeners app is not ready (is it in INSTALLED_APPS?)")
    return AGENT


def served_here(run_id: Optional[str]) -> bool:
    """Whether this process serves the listener whose run id (task domain) is ``run_id`` now."""
    return bool(run_id) and any(run.domain == run_id for run in the_runtime().stats().active_runs)
