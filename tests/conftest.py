"""Test configuration: the project's own pytest plugin gives every test the real server."""

pytest_plugins = ["conductor_agents.testing.pytest_plugin"]

from typing import Dict, Iterator

import pytest

from conductor_agents import LocalServer
from conductor_agents.testing import ScriptedLLM

#: The restartable servers' settings. ``systemTaskPostponeThreshold=0`` makes the join after a
#: waiting message task back off from its first check (test_long_wait); the script limit is
#: generous because several servers share two cores (the server's own 4 s was seen to run out).
RESTARTABLE_PROPERTIES = {"conductor.app.systemTaskPostponeThreshold": "0"}
RESTARTABLE_ENV = {"CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "60"}


class RestartableServers:
    """One real server per backend that tests may restart and stop (never the session's, which every
    other test uses): started on first use, and again for the next test after one stopped it. Each
    costs a JVM start (20-50 s here), so the restart tests share them instead of starting their own."""

    def __init__(self, llm: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._llm = llm
        self._tmp = tmp_path_factory
        self._servers: Dict[str, LocalServer] = {}

    def get(self, backend: str = "sqlite") -> LocalServer:
        server = self._servers.get(backend)
        if server is None:
            server = LocalServer(self._tmp.mktemp(f"restartable-{backend}"), backend=backend,
                                 env={**self._llm.server_env(), **RESTARTABLE_ENV},
                                 properties=RESTARTABLE_PROPERTIES, startup_timeout=600)
            self._servers[backend] = server
        if not server.is_running:
            server.start()
        return server

    def stop(self) -> None:
        for server in self._servers.values():
            server.stop()


@pytest.fixture(scope="session")
def restartable_servers(scripted_llm: ScriptedLLM,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableServers]:
    servers = RestartableServers(scripted_llm, tmp_path_factory)
    try:
        yield servers
    finally:
        servers.stop()
