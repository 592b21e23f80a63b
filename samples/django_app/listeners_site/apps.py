"""Builds the process's runtime once, when Django is ready."""

from __future__ import annotations

import atexit
import os

from django.apps import AppConfig

from conductor_agents import AgentRuntime


class ListenersConfig(AppConfig):
    name = "listeners_site"

    def ready(self) -> None:
        from . import agents

        if agents.runtime is not None:  # ready() may run twice (e.g. the autoreloader)
            return
        agents.AGENT = agents.build_agent(agents.TOOLS)
        agents.runtime = AgentRuntime()  # CONDUCTOR_SERVER_URL, ... from the environment
        agents.runtime_built_in_pid = os.getpid()
        # Serve the agent: the listeners this process starts, and those of a worker that went away.
        # Forked workers serve it too. Every process that exits closes its own runtime (serve() also
        # does it at exit), which hands its listeners over to the other workers (docs/operations.md).
        agents.runtime.serve(agents.AGENT, on_adopt=agents.adopted)
        atexit.register(agents.runtime.close)
