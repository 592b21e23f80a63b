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
        agents.runtime = AgentRuntime()  # CONDUCTOR_SERVER_URL, ... from the environment
        agents.runtime_built_in_pid = os.getpid()
        # Every process that exits closes its own runtime: a forked worker closes the workers it
        # built, never the master's (see docs/operations.md).
        atexit.register(agents.runtime.close)
